"""Small builders for Amazon States Language (JSONPath) documents."""
import collections
import re

from controlplane import request


_RESERVED = re.compile(r"['{}\\\\]")
_PLACEHOLDER = re.compile(r"\$\{[A-Za-z0-9_]+\}")


def quote(text):
    """A literal for an intrinsic function argument. Its reserved characters (' { } \\) would
    need escapes, which moto does not undo the way AWS does: they are refused instead (the
    `${Name}` placeholders the CDK fills are fine)."""
    text = str(text)
    if _RESERVED.search(_PLACEHOLDER.sub("", text)):
        raise ValueError("intrinsic literal %r holds one of ' { } \\" % text)
    return "'%s'" % text


def fmt(template, *paths):
    """`States.Format` of a literal template ({} holes) and argument expressions."""
    pieces = template.split("{}")
    if len(pieces) != len(paths) + 1:
        raise ValueError("template %r needs %d arguments, got %d" % (template, len(pieces) - 1, len(paths)))
    literal = "{}".join(quote(piece)[1:-1] for piece in pieces)  # holes stay unescaped
    return "States.Format(%s)" % ", ".join(["'%s'" % literal] + list(paths))


def to_json(path):
    return "States.JsonToString(%s)" % path


def pass_state(next_state, parameters=None, result_path="$", result=None):
    state = {"Type": "Pass"}
    if parameters is not None:
        state["Parameters"] = parameters
    if result is not None:
        state["Result"] = result
    state["ResultPath"] = result_path
    state.update(_next(next_state))
    return state


def choice(rules, default):
    return {"Type": "Choice", "Choices": rules, "Default": default}


def rule(condition, next_state):
    return dict(condition, Next=next_state)


def any_of(*conditions):
    return conditions[0] if len(conditions) == 1 else {"Or": list(conditions)}


def all_of(*conditions):
    return conditions[0] if len(conditions) == 1 else {"And": list(conditions)}


def negate(condition):
    return {"Not": condition}


def fail(error, cause_path):
    return {"Type": "Fail", "Error": error, "CausePath": cause_path}


def task(resource, parameters, next_state, result_path=None, result_selector=None, catch=None, retry=None):
    state = {"Type": "Task", "Resource": resource, "Parameters": parameters}
    if result_selector is not None:
        state["ResultSelector"] = result_selector
    state["ResultPath"] = result_path
    if retry:
        state["Retry"] = retry
    if catch:
        state["Catch"] = catch
    state.update(_next(next_state))
    return state


def sdk(service, action):
    return "arn:aws:states:::aws-sdk:%s:%s" % (service, action)


def publish(topic, message_expression, next_state, subject=None):
    """sns:Publish that never fails the machine: a lost notification must not stop a job's monitor."""
    parameters = {"TopicArn": topic, "Message.$": message_expression}
    if subject:
        parameters["Subject"] = subject
    return task("arn:aws:states:::sns:publish", parameters, next_state,
                catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": "$.notify_error", "Next": next_state}])


def state_machine(comment, start_at, states):
    """A whole definition, refused when a state name is used twice anywhere in it (ASL specification,
    "States": names MUST be unique within the state machine; a Map item processor or Parallel branch is
    no scope of its own, and CloudFormation fails the CREATE with DUPLICATE_STATE_NAME)."""
    definition = {"Comment": comment, "StartAt": start_at, "States": states}
    duplicates = sorted(name for name, count in collections.Counter(state_names(definition)).items() if count > 1)
    if duplicates:
        raise ValueError("state names used more than once in the definition: %s" % ", ".join(duplicates))
    return definition


def state_names(machine):
    """The name of every state of `machine` (a definition, Map item processor or Parallel branch), nested
    ones included, once per occurrence."""
    names = []
    for name, state in machine["States"].items():
        names.append(name)
        nested = [state[key] for key in ("ItemProcessor", "Iterator") if key in state] + state.get("Branches", [])
        for inner in nested:
            names += state_names(inner)
    return names


def _next(next_state):
    return {"End": True} if next_state is None else {"Next": next_state}


def expression(marker):
    """The JSONPath or intrinsic that evaluates an `controlplane.request` marker."""
    if isinstance(marker, request.Path):
        return marker.path
    if isinstance(marker, request.Format):
        return fmt(marker.template, *[expression(arg) for arg in marker.args])
    if isinstance(marker, request.JsonText):
        return to_json(expression(marker.value))
    if isinstance(marker, request.Sum):
        return "States.MathAdd(%s, %s)" % (expression(marker.left), expression(marker.right))
    raise TypeError("not an controlplane.request marker: %r" % (marker,))


def parameters(value):
    """A request built by `controlplane.request` as Parameters: each marker under key K becomes `K.$`."""
    if isinstance(value, dict):
        result = collections.OrderedDict()
        for key, item in value.items():
            if request.is_marker(item):
                result[key + ".$"] = expression(item)
            else:
                result[key] = parameters(item)
        return result
    if isinstance(value, (list, tuple)):
        if any(request.is_marker(item) for item in value):
            raise ValueError("a list item cannot come from a path in Parameters: %r" % (value,))
        return [parameters(item) for item in value]
    return value

