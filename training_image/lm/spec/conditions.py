"""Rules between fields: conditions over dotted input paths, and the message when one holds.

`Rule(name, when, message)`: `when` is made of `Is`, `OneOf`, `Above`, `Not` and `All` over
dotted paths of the input (`"strategy"`, `"deploy.enabled"`); `holds(when, config)` evaluates it
in Python, and the state machine generator (`stacks.state_machine.inputs`) turns the same
condition into a Choice rule and a Fail state. A message may hold `{value}`: the value at the
rule's `subject` path. The rules themselves are written where their facts live: the job's in
`lm.spec.job` (with what each family lacks, from its declared capabilities), the deployment's in
`controlplane.rules`.

Pure Python 3.8, no TensorFlow: imported at synth time.
"""
import collections

STRATEGY_FIELD = "strategy"
INSTANCE_TYPE_FIELD = "instance_type"
INSTANCE_COUNT_FIELD = "instance_count"


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


INVALID = "InvalidInput"  # the error of an execution a rule refuses (the gate's others: controlplane.gate)


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
    config does not have are skipped (`controlplane.planner` knows only strategy and instances)."""
    for found in rules:
        if any(value_at(config, path) is _MISSING for path in paths(found.when)):
            continue
        if holds(found.when, config):
            return message_of(found, config)
    return None
