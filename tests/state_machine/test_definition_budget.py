"""Presets are data: the training machine maps every preset to its configuration and its plan gate
covers every preset, and the definition stays under Step Functions' limit as presets are added.

The limit: "Maximum request size: 1 MB per request", which holds a CreateStateMachine or
UpdateStateMachine definition (Step Functions developer guide, "Step Functions service quotas",
quotas related to API action requests); CloudFormation's StateMachine handler refuses a
DefinitionS3Location object over 1,048,576 bytes before that ("State Machine definition file cannot
exceed 1MB", aws-cloudformation-resource-providers-stepfunctions, Constants.MAX_DEFINITION_SIZE).
The definition the stack deploys is the file `definition_text(build_training_definition(settings))`
(stacks.orchestration: compact JSON), placeholders filled by CloudFormation. The template, whose
own limit is 1,000,000 bytes, holds only its location (tests/cdk/test_stack.py).

Measured here by adding synthetic presets (copies of the GPT-3 shapes, one layer more) and
synthetic GPU instance types (copies of real ones, priced as a p4d): with the Llama presets the
definition is about 750 KB, each GPT-sized preset adds about 44 KB (almost all of it the plan gate:
one Choice rule and one Fail state per instance type x strategy it cannot run with its own
message; the gate branches on instance type and strategy before it tests presets,
stacks.state_machine.plan_gate) and each GPU instance type about 13 KB.
"""
import collections
import contextlib
import json
from unittest import mock

import pytest

from controlplane import presets, prices, rules
from lm.spec import conditions, hardware
from stacks.settings import Settings
from stacks.state_machine import build_training_definition, definition_text

DEFINITION_LIMIT = 1024 * 1024
# What the definition must still hold: this many more GPT-sized presets and GPU instance types,
# with this share of the limit to spare (for the placeholders CloudFormation fills and what the
# next change adds).
MORE_PRESETS = 5
MORE_INSTANCE_TYPES = 2
MARGIN = 0.05


def definition_bytes():
    rules.serving_rules.cache_clear()  # cached per table; the tables are patched here
    return len(definition_text(build_training_definition(Settings())))


def synthetic_presets(count):
    """`count` presets shaped like the GPT-3 presets (tiny left out), each one layer deeper: new shapes."""
    shapes = [config for name, config in presets.GPT_PRESETS.items() if name != "tiny"]
    return collections.OrderedDict(
        ("synthetic-%d" % index, shapes[-1 - index % len(shapes)].replace(n_layer=shapes[-1 - index % len(shapes)].n_layer + 1))
        for index in range(count))


@contextlib.contextmanager
def more_presets(extra):
    """The preset tables with `extra` GPT presets, changed in place (the planner and the stages hold them)."""
    with mock.patch.dict(presets.GPT_PRESETS, extra), mock.patch.dict(presets.ALL_PRESETS, extra):
        yield


def more_instance_types(count):
    gpu = [instance for instance in hardware.INSTANCES.values() if instance.gpus]
    extra = collections.OrderedDict(("ml.synthetic%d.48xlarge" % index, gpu[-1 - index]._replace(
        name="ml.synthetic%d.48xlarge" % index)) for index in range(count))
    price = prices.ON_DEMAND_USD_PER_HOUR["ml.p4d.24xlarge"]
    return mock.patch.dict(hardware.INSTANCES, extra), mock.patch.dict(
        prices.ON_DEMAND_USD_PER_HOUR, {name: price for name in extra})


def test_the_definition_holds_more_presets_and_instance_types_with_margin():
    extra = synthetic_presets(MORE_PRESETS)
    instances, priced = more_instance_types(MORE_INSTANCE_TYPES)
    with more_presets(extra), instances, priced:
        grown = definition_bytes()
    assert grown < DEFINITION_LIMIT * (1 - MARGIN), (
        "with %d more presets and %d more GPU instance types the training definition is %d bytes, over %d%% of "
        "Step Functions' %d" % (MORE_PRESETS, MORE_INSTANCE_TYPES, grown, 100 * (1 - MARGIN), DEFINITION_LIMIT))


def test_the_measurement_sees_each_preset():
    """The budget test can fail: a preset grows the definition (its configuration state, its plan gate rules)."""
    base = definition_bytes()
    with more_presets(synthetic_presets(1)):
        assert definition_bytes() > base + len(presets.model_config("gpt-13b"))


def test_a_new_preset_is_mapped_to_its_configuration_and_gated_by_the_plan():
    """A preset added to the table only: the machine gives the job its configuration, and the plan
    gate refuses it where the planner says it cannot run, as for the preset it copies."""
    extra = collections.OrderedDict([("gpt-13b-copy", presets.GPT_PRESETS["gpt-13b"])])
    with more_presets(extra):
        states = build_training_definition(Settings())["States"]
        gate = rules.plan_rules()
    mapped = [rule["Next"] for rule in states["Run.ModelConfig"]["Choices"]
              if rule["StringEquals"] == "gpt-13b-copy"]
    assert [states[name]["Result"] for name in mapped] == [presets.model_config("gpt-13b")]
    single_small = {"preset": "gpt-13b-copy", "strategy": "single", "instance_type": "ml.g5.2xlarge",
                    "hyperparameters": {"recompute": True}}
    assert "lmstack.plan" in conditions.broken(gate, single_small)
    assert conditions.broken(gate, dict(single_small, instance_type="ml.p4de.24xlarge", strategy="smp")) is None


@pytest.mark.parametrize("preset", list(presets.ALL_PRESETS))
def test_each_preset_configuration_fits_a_sagemaker_hyperparameter(preset):
    """HyperParameters values are at most 2500 characters (botocore's sagemaker model: HyperParameterValue)."""
    assert len(json.dumps(presets.model_config(preset))) <= 2500
