"""Every input rule, written once: the field type, the messages, and the rules between fields.

Read by the state machine's validation states (`stacks.state_machine.inputs` turns each
rule into a Choice rule and a Fail state), `lmstack.start` (checks an input before it
starts anything), `stacks.config` (the deployment's defaults) and `lm.plan` (what cannot
run), and by `lm.job.validate_hyperparameters` (what `lm.train` and `lm.prepare` accept).

- `Field`: name, type, default, bounds, choices, prefix; `check(field, value, label)`
  raises ValueError with the message of the first problem; the `*_message(field)`
  functions are the texts both Python and the ASL states use.
- `cross_field_rules(runtimes)`: the rules that relate fields, as `Rule(name, when,
  message)`. `when` is a condition made of `Is`, `OneOf`, `Above`, `Not` and `All` over
  dotted paths of the input (`"strategy"`, `"deploy.enabled"`); `holds(when, config)`
  evaluates it in Python, the state machine generator turns it into a Choice condition.
  A message may hold `{value}`: the value at the rule's `subject` path.

Adding a rule between fields is one entry in `cross_field_rules`; every path picks it up.
`plan_rules()` are the same kind of rules, made from `lm.plan`'s feasibility table (error
PlanRejected): the ones that say a preset cannot fit or run on an instance type.

Pure Python 3.8, no TensorFlow: imported at synth time.
"""
import collections
import dataclasses
import functools
import json
from typing import Any, Optional, Tuple

STRATEGY_FIELD = "strategy"
INSTANCE_TYPE_FIELD = "instance_type"
INSTANCE_COUNT_FIELD = "instance_count"


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


def unknown_message(label, allowed):
    return "%s has an unknown field; allowed: %s" % (label, ", ".join(allowed))


def problem(spec, value):
    """The message of the first problem of `value` for `spec` (objects: only their type), or None."""
    if spec.type is object or (value is None and spec.nullable):
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
    if spec.type in (int, float) and value is not None:
        return spec.type(value)
    return value


def check_object(fields, value, prefix=""):
    """Check a whole (nested) input object against `fields`: unknown names and every value."""
    known = collections.OrderedDict((spec.name, spec) for spec in fields)
    unknown = [name for name in value if name not in known]
    if unknown:
        raise ValueError("%s; got %s" % (unknown_message(prefix[:-1] or "the input", known), ", ".join(
            prefix + name for name in unknown)))
    for name, item in value.items():
        spec = known[name]
        check(spec, item, prefix + name)
        if spec.type is dict:
            check_object(spec.fields, item, prefix + name + ".")


def defaults(fields):
    """The input every field's default makes."""
    return collections.OrderedDict(
        (spec.name, defaults(spec.fields) if spec.type is dict else spec.default) for spec in fields)


def with_defaults(fields, given):
    """A checked input merged over the defaults (nested objects field by field)."""
    def merge(base, overrides):
        for key, value in overrides.items():
            if isinstance(base.get(key), dict):
                merge(base[key], value)
            else:
                base[key] = value
        return base
    return merge(defaults(fields), given)


# ---- rules between fields ----

class Is(collections.namedtuple("Is", "path value")):
    """The value at `path` equals `value` (a str, a bool or None)."""


class OneOf(collections.namedtuple("OneOf", "path values")):
    """The str at `path` is one of `values`."""


class Above(collections.namedtuple("Above", "path limit")):
    """The number at `path` is greater than `limit`."""


class Not(collections.namedtuple("Not", "condition")):
    pass


class All(collections.namedtuple("All", "conditions")):
    pass


INVALID = "InvalidInput"
PLAN_REJECTED = "PlanRejected"


class Rule(collections.namedtuple("Rule", "name when message subject error")):
    """Reject an input for which `when` holds, with `message` (`{value}`: the value at `subject`);
    `error`: the execution's error name."""


def rule(name, when, message, subject=None, error=INVALID):
    return Rule(name, when, message, subject, error)


_MISSING = object()


def value_at(config, path):
    value = config
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def paths(condition):
    """Every input path a condition reads."""
    if isinstance(condition, Not):
        return paths(condition.condition)
    if isinstance(condition, All):
        return [path for part in condition.conditions for path in paths(part)]
    return [condition.path]


def holds(condition, config):
    if isinstance(condition, Not):
        return not holds(condition.condition, config)
    if isinstance(condition, All):
        return all(holds(part, config) for part in condition.conditions)
    value = value_at(config, condition.path)
    if isinstance(condition, Is):
        return value == condition.value and type(value) is type(condition.value)
    if isinstance(condition, OneOf):
        return value in condition.values
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > condition.limit


def message_of(found, config):
    if found.subject is None:
        return found.message
    return found.message.replace("{value}", repr(value_at(config, found.subject)))


def broken(rules, config):
    """The message of the first rule `config` breaks, or None. Rules that read a path the
    config does not have are skipped (`lm.plan` knows only strategy and instances)."""
    for found in rules:
        if any(value_at(config, path) is _MISSING for path in paths(found.when)):
            continue
        if holds(found.when, config):
            return message_of(found, config)
    return None


def preset_family_rule(family, presets, label="preset"):
    return rule("preset.family.%s" % family, All((Is("hyperparameters.model", family), Not(OneOf("preset", presets)))),
                "%s {value} is not a preset of model %s; allowed: %s" % (label, family, ", ".join(presets)),
                subject="preset")


def plan_rules():
    """What `lm.plan.feasibility_table()` says cannot fit or run (one row per preset x GPU
    instance type x strategy, for the smallest run: one sequence per replica), grouped by
    instance type, strategy and reason. A combination that fits only with activation
    recomputation is rejected while `hyperparameters.recompute` is false."""
    from lm import plan  # lm.plan reads cross_field_rules: imported here, not at the top

    grouped = collections.OrderedDict()  # (instance type, strategy, message, needs recompute) -> presets
    for row in plan.feasibility_table():
        if not row["ok"]:
            key = (row["instance_type"], row["strategy"], "lm.plan: %s" % (row["reason"] or ""), False)
            if row["suggestion"]:
                key = key[:2] + ("%s; suggestion: %s" % (key[2], row["suggestion"]),) + key[3:]
        elif row["recompute_required"]:
            key = (row["instance_type"], row["strategy"],
                   "lm.plan: this preset fits %s on %s only with activation recomputation; "
                   "set hyperparameters.recompute to true" % (row["strategy"], row["instance_type"]), True)
        else:
            continue
        grouped.setdefault(key, []).append(row["preset"])
    found = []
    for index, ((instance_type, strategy, message, needs_recompute), presets) in enumerate(grouped.items()):
        conditions = (Is(STRATEGY_FIELD, strategy), Is(INSTANCE_TYPE_FIELD, instance_type), OneOf("preset", presets))
        if needs_recompute:
            conditions += (Is("hyperparameters.recompute", False),)
        found.append(rule("%d.%s.%s" % (index, strategy, instance_type), All(conditions), message,
                          error=PLAN_REJECTED))
    return found


def smp_recompute_rule():
    """SMP with activation recomputation cannot train: the ranks other than the one that traces the
    model import its serialized graph, and `tf.recompute_grad`'s gradient (a Python custom
    gradient) exists only in the tracing process, so their backward pass raises "LookupError: No
    gradient defined for operation"."""
    return rule("strategy.smp.recompute", All((Is(STRATEGY_FIELD, "smp"), Is("hyperparameters.recompute", True))),
                "hyperparameters.recompute must be false with strategy smp: the SMP ranks other than the tracing one "
                "import the traced graph, where the gradient of tf.recompute_grad is not defined (LookupError: No "
                "gradient defined for operation); lm.plan finds the partitions, microbatches and seq_len that fit "
                "without it")


def export_hf_family_rule():
    return rule("export_hf.family", All((Is("hyperparameters.export_hf", True), Not(Is("hyperparameters.model", "gpt")))),
                "hyperparameters.export_hf needs model gpt (the GPT-2 layout), got model {value}",
                subject="hyperparameters.model")


@functools.lru_cache(maxsize=None)
def serving_rules():
    """`deploy.container` tgi and lmi: they serve the Hugging Face export (which needs model gpt)
    on an instance whose GPUs hold the model (`lm.containers.gpu_shards`, grouped by instance type).

    A tuple, built once: it depends only on the preset, instance and container tables, and
    `lm.plan.feasibility_table` asks for the cross-field rules thousands of times."""
    from lm import containers

    found = [export_hf_family_rule()]
    for container in containers.SERVED_FAMILIES:
        found.extend(_container_fit_rules(container))
    return tuple(found)


def _container_fit_rules(container):
    from lm import containers
    from lm.config import ALL_PRESETS
    from lm.instances import HOSTING_INSTANCE_TYPES

    chosen = (Is("deploy.enabled", True), Is("deploy.container", container))
    found = [rule("deploy.container.%s.export_hf" % container, All(chosen + (Is("hyperparameters.export_hf", False),)),
                  "deploy.container %s serves the Hugging Face export: set hyperparameters.export_hf to true" % container)]
    exported = [preset for preset, config in ALL_PRESETS.items() if config.family == "gpt"]  # export_hf.family
    cannot = collections.OrderedDict()  # instance type -> [(preset, reason)]
    for preset in exported:
        for instance_type in HOSTING_INSTANCE_TYPES:
            shards, reason = containers.gpu_shards(container, ALL_PRESETS[preset], instance_type)
            if shards is None:
                cannot.setdefault(instance_type, []).append((preset, reason))
    for instance_type, rows in cannot.items():
        presets = [preset for preset, _ in rows]
        if len(presets) == len(exported):
            message = "deploy.container %s: %s; choose another deploy.instance_type" % (container, rows[0][1])
        else:
            message = "deploy.container %s cannot serve preset {value} on deploy.instance_type %s (%s); " \
                      "choose a larger deploy.instance_type or preset" % (container, instance_type, "; ".join(
                          "%s %s" % row for row in rows))
        found.append(rule("deploy.container.%s.%s" % (container, instance_type), All(chosen + (
            Is("deploy.instance_type", instance_type), OneOf("preset", presets))), message, subject="preset"))
    return found


def cross_field_rules(runtimes=None):
    """The rules between fields for a deployment that builds `runtimes` (None: all of them)."""
    from lm import job  # lm.job's tables are made of Fields: imported here, not at the top

    built = tuple(job.RUNTIMES) if runtimes is None else tuple(runtimes)
    found = [preset_family_rule(family, spec.presets) for family, spec in job.FAMILIES.items()]
    found.extend(serving_rules())
    for strategy in job.STRATEGIES:
        runtime = job.STRATEGY_RUNTIME[strategy]
        if runtime not in built:
            found.append(rule("strategy.%s.runtime" % strategy, Is(STRATEGY_FIELD, strategy),
                              "strategy %s needs the %s image, which this deployment does not build (runtimes: %s)"
                              % (strategy, runtime, ", ".join(built))))
    for strategy, instance_types in job.STRATEGY_INSTANCE_TYPES.items():
        found.append(rule("strategy.%s.instance_type" % strategy,
                          All((Is(STRATEGY_FIELD, strategy), Not(OneOf(INSTANCE_TYPE_FIELD, instance_types)))),
                          "strategy %s runs only on instance_type %s (the SageMaker support list)"
                          % (strategy, ", ".join(instance_types))))
    found.append(smp_recompute_rule())
    found.append(rule("strategy.single.instance_count", All((Is(STRATEGY_FIELD, "single"),
                                                            Above(INSTANCE_COUNT_FIELD, 1))),
                      "strategy single runs on one instance, got instance_count={value}: set instance_count to 1 "
                      "or choose one of %s" % ", ".join(strategy for strategy in job.STRATEGIES if strategy != "single"),
                      subject=INSTANCE_COUNT_FIELD))
    # lm.prepare trains its tokenizer when it is given none (nor init_from's): once, on one instance.
    found.append(rule("prepare.tokenizer.instance_count", All((
        Is("prepare.enabled", True), Above("prepare.instance_count", 1), Is("prepare.hyperparameters.tokenizer", ""),
        Is("init_from", None))),
        "prepare trains its tokenizer (prepare.hyperparameters.tokenizer is empty, init_from is null) on one instance, "
        "got prepare.instance_count={value}: set it to 1, or give a tokenizer file on the file system (python -m "
        "lm.prepare train-tokenizer makes one)", subject="prepare.instance_count"))
    for stage, runtime in (("deploy", job.SERVING_RUNTIME), ("prepare", job.PREPARE_RUNTIME)):
        if runtime not in built:
            found.append(rule("%s.runtime" % stage, Is("%s.enabled" % stage, True),
                              "%s needs the %s image, which this deployment does not build (runtimes: %s)"
                              % (stage, runtime, ", ".join(built))))
    return found



# ---- names the services restrict ----
# Read by the Validate stage (`stacks.state_machine.inputs`), `lmstack.start` and `stacks.config`.
# SageMaker: EndpointName and TrainingJobName match ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$ (1-63 characters;
# botocore's sagemaker service model, shapes EndpointName and TrainingJobName). The execution name
# becomes a tag value (TagValue: ^([\p{L}\p{Z}\p{N}_.:/=+\-@]*)$) and a part of S3 keys (the
# checkpoint and TensorBoard prefixes; "Creating object key names", Amazon S3 user guide: letters,
# digits and - _ . are the safe characters). Step Functions itself allows execution names of 1-80
# characters with letters, digits and most punctuation ("StartExecution", Step Functions API reference).
ALPHANUMERIC = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
SAGEMAKER_NAME_MAX = 63
EXECUTION_NAME_MAX = 80
EXECUTION_NAME = "$$.Execution.Name"  # the path of the execution's own name (not part of the input)
# A training job's name: <prefix>-<token>-<MD5 of the execution ARN, 32 hex digits>-<attempt>.
JOB_NAME_HASH_LENGTH = 32


class NameRule(collections.namedtuple("NameRule", "name path label alphabet max_length alphanumeric_last describes")):
    """A name a service restricts: non-empty, only `alphabet` characters, at most `max_length`
    characters, a letter or digit last when `alphanumeric_last`. `path`: the dotted input path, or
    EXECUTION_NAME; `label`: what a message calls it; `describes`: the allowed form, for messages."""


def name_rules(name_prefix):
    """The names an execution gives to AWS resources, for a deployment whose names start with
    `name_prefix` (the endpoint is `<name_prefix>-<deploy.endpoint_name>`)."""
    endpoint_max = SAGEMAKER_NAME_MAX - len(name_prefix) - 1
    return [
        NameRule("deploy.endpoint_name", "deploy.endpoint_name", "deploy.endpoint_name", ALPHANUMERIC + "-",
                 endpoint_max, True, "letters, digits and hyphens, ending with a letter or digit, at most %d "
                 "characters (SageMaker endpoint names: 63 characters with %s- in front)" % (endpoint_max, name_prefix)),
        NameRule("execution.name", EXECUTION_NAME, "the execution name", ALPHANUMERIC + "-_", EXECUTION_NAME_MAX, False,
                 "letters, digits, - and _ (it becomes a tag value and a part of S3 keys)"),
    ]


def name_problem(found, value):
    """The message `found` (a NameRule) gives `value`, or None when the name is fine."""
    if isinstance(value, str) and value and len(value) <= found.max_length and all(
            char in found.alphabet for char in value) and (not found.alphanumeric_last or value[-1] in ALPHANUMERIC):
        return None
    return "%s must be %s, got %s" % (found.label, found.describes, json.dumps(value))


def job_name_length(name_prefix, token, max_attempts):
    """The length of the longest training job name the state machine builds (see NameRule)."""
    return len(name_prefix) + 1 + len(token) + 1 + JOB_NAME_HASH_LENGTH + 1 + len(str(max_attempts))
