"""The definitions as documents: every state name is used once (ASL specification, "States"), which the
generator enforces while it builds them (`asl.state_machine`)."""
import collections

import pytest

from state_machine.harness import StandInSettings

from controlplane import base_images
from stacks.state_machine import asl, build_stop_definition, build_training_definition

SETTINGS = [StandInSettings(), StandInSettings(runtimes=("tfcurrent",), az_count=3, spot=True)] + [
    StandInSettings(runtimes=(runtime,)) for runtime in base_images.RUNTIMES]


@pytest.mark.parametrize("build", [build_training_definition, build_stop_definition])
@pytest.mark.parametrize("settings", SETTINGS)
def test_every_state_name_is_used_once(build, settings):
    names = asl.state_names(build(settings))
    assert [name for name, count in collections.Counter(names).items() if count > 1] == []


def _map_state(item_state_name, next_state=None):
    return dict({"Type": "Map", "ItemsPath": "$.items", "ItemProcessor": {
        "ProcessorConfig": {"Mode": "INLINE"}, "StartAt": item_state_name,
        "States": {item_state_name: {"Type": "Pass", "End": True}}}},
        **({"Next": next_state} if next_state else {"End": True}))


@pytest.mark.parametrize("states", [
    {"First": _map_state("First")},                                      # a Map item named like a top state
    {"First": _map_state("Item", "Second"), "Second": _map_state("Item")},  # the items of two Maps
    {"First": {"Type": "Parallel", "End": True, "Branches": [
        {"StartAt": "Branch", "States": {"Branch": {"Type": "Pass", "End": True}}},
        {"StartAt": "Branch", "States": {"Branch": {"Type": "Pass", "End": True}}}]}},  # two Parallel branches
])
def test_the_generator_refuses_a_duplicate_state_name(states):
    with pytest.raises(ValueError, match="state names used more than once in the definition: (First|Item|Branch)"):
        asl.state_machine("duplicate", "First", states)


# The Step Functions developer guide, "Handle Lambda service exceptions" (bp-lambda-serviceexception): the
# errors of an invocation that did not run the function, which its example Retry lists.
LAMBDA_TRANSIENT_ERRORS = {"Lambda.ClientExecutionTimeoutException", "Lambda.ServiceException",
                           "Lambda.AWSLambdaException", "Lambda.SdkClientException"}


def _states(machine):
    for name, state in machine["States"].items():
        yield name, state
        for inner in [state[key] for key in ("ItemProcessor", "Iterator") if key in state] + state.get("Branches", []):
            yield from _states(inner)


@pytest.mark.parametrize("settings", SETTINGS[:2])
def test_every_invocation_of_the_gate_retries_lambdas_transient_errors(settings):
    invocations = {name: state for name, state in _states(build_training_definition(settings))
                   if state.get("Resource") == "arn:aws:states:::lambda:invoke"}
    assert len(invocations) >= 2  # Validate and the re-plan of a fallback instance type
    for name, state in invocations.items():
        retried = {error for retrier in state["Retry"] for error in retrier["ErrorEquals"]}
        assert LAMBDA_TRANSIENT_ERRORS <= retried, (name, LAMBDA_TRANSIENT_ERRORS - retried)
