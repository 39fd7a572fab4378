"""An input field: its type, bounds and choices, and the messages that name what is allowed.

The leaf of the specification: the hyperparameter tables (`lm.spec.job`), the execution input
(`stacks.state_machine.inputs`), the serving request checks (`lm.serving.wsgi`) and the
deployment settings are made of `Field`s; the same `*_message(field)` texts are used by
Python and by the state machine's Choice states.

`check(field, value, label)` raises ValueError with the message of the first problem; a whole
(nested) execution input is checked by the control plane (`controlplane.inputs.check_object`).

Pure Python 3.8, no TensorFlow: imported at synth time.
"""
import dataclasses
from typing import Any, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Field:
    """One input field. `type`: str, int, float, bool, dict (an object of `fields`) or object
    (any JSON, unchecked)."""
    name: str
    type: Any
    default: Any = None
    minimum: Any = None
    maximum: Any = None
    choices: Optional[Tuple[str, ...]] = None
    nullable: bool = False
    prefix: Optional[str] = None  # a str must start with it
    words: Tuple[str, ...] = ()  # strings a number field accepts besides its numbers ("auto")
    fields: Tuple["Field", ...] = ()
    help: str = ""


def field(name, type_, default=None, minimum=None, maximum=None, choices=None, help="", **options):
    return Field(name, type_, default, minimum, maximum, tuple(choices) if choices else None, help=help, **options)


# ---- the messages of one field ----

def type_message(spec):
    if spec.type is bool:
        return "must be true or false"
    if spec.type is str:
        return "must be a string or null" if spec.nullable else "must be a string"
    if spec.type is dict:
        return "must be a JSON object"
    kind = "an integer" if spec.type is int else "a number"
    if spec.words:
        kind = "%s or %s" % (kind, " or ".join('"%s"' % word for word in spec.words))
    return "must be %s or null" % kind if spec.nullable else "must be %s" % kind


def choice_message(spec):
    return "must be one of %s" % ", ".join(spec.choices)


def prefix_message(spec):
    return "must start with %s" % spec.prefix


def range_message(spec):
    if spec.maximum is None:
        return "must be at least %s" % spec.minimum
    if spec.minimum is None:
        return "must be at most %s" % spec.maximum
    return "must be between %s and %s" % (spec.minimum, spec.maximum)


def problem(spec, value):
    """The message of the first problem of `value` for `spec` (objects: only their type), or None."""
    if spec.type is object or (value is None and spec.nullable) or (isinstance(value, str) and value in spec.words):
        return None
    if spec.type is dict:
        return None if isinstance(value, dict) else type_message(spec)
    if spec.type is bool:
        return None if isinstance(value, bool) else type_message(spec)
    if spec.type is str:
        if not isinstance(value, str):
            return type_message(spec)
        if spec.choices and value not in spec.choices:
            return choice_message(spec)
        if spec.prefix and not value.startswith(spec.prefix):
            return prefix_message(spec)
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            spec.type is int and not float(value).is_integer()):
        return type_message(spec)
    if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
        return range_message(spec)
    return None


def check(spec, value, label):
    """`value` as the field's type; ValueError "<label> <message>, got <value>" otherwise."""
    message = problem(spec, value)
    if message:
        raise ValueError("%s %s, got %r" % (label, message, value))
    if spec.type in (int, float) and value is not None and value not in spec.words:
        return spec.type(value)
    return value
