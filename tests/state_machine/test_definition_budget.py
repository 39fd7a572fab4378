"""The training definition stays small however many presets and GPU instance types a fork adds.

The limits: "Maximum request size: 1 MB per request", which holds a CreateStateMachine or
UpdateStateMachine definition (Step Functions developer guide, "Step Functions service quotas");
CloudFormation's StateMachine handler refuses a DefinitionS3Location object over 1,048,576 bytes
("State Machine definition file cannot exceed 1MB", aws-cloudformation-resource-providers-stepfunctions,
Constants.MAX_DEFINITION_SIZE). The definition the stack deploys is the file
`definition_text(build_training_definition(settings))` (stacks.orchestration: compact JSON).

The input checks and the plan are the gate's (`controlplane.gate`, a Lambda function), not states: the
definition holds no preset and no instance type. Before the gate it was 745,822 bytes and 1,633 states
(about 1,400 of them the input checks and the plan gate; 44 KB more per GPT-sized preset, 13 KB per GPU
type). Measured here with the most subnets the settings allow, then with synthetic presets (copies of the
GPT-3 shapes, one layer more) and GPU instance types (copies of real ones, priced as a p4d).
"""
import collections
import contextlib
import json
from unittest import mock

import pytest

from controlplane import gate, presets, prices
from lm.spec import hardware
from stacks.settings import MAX_AZ_COUNT, Settings
from stacks.state_machine import build_training_definition, definition_text

DEFINITION_MAX_BYTES = 350_000
PRESET_MAX_BYTES = 10_000  # what one more preset may add
MORE = 5


def definition_bytes():
    return len(definition_text(build_training_definition(Settings(az_count=MAX_AZ_COUNT))))


def synthetic_presets(count):
    """`count` presets shaped like the GPT-3 presets (tiny left out), each one layer deeper: new shapes."""
    shapes = [config for name, config in presets.GPT_PRESETS.items() if name != "tiny"]
    return collections.OrderedDict(
        ("synthetic-%d" % index, shapes[-1 - index % len(shapes)].replace(n_layer=shapes[-1 - index % len(shapes)].n_layer + 1))
        for index in range(count))


@contextlib.contextmanager
def more_presets(extra):
    """The preset tables with `extra` GPT presets, changed in place (the planner and the gate hold them)."""
    with mock.patch.dict(presets.GPT_PRESETS, extra), mock.patch.dict(presets.ALL_PRESETS, extra):
        yield


@contextlib.contextmanager
def more_instance_types(count):
    gpu = [instance for instance in hardware.INSTANCES.values() if instance.gpus]
    extra = collections.OrderedDict(("ml.synthetic%d.48xlarge" % index, gpu[-1 - index]._replace(
        name="ml.synthetic%d.48xlarge" % index)) for index in range(count))
    price = prices.ON_DEMAND_USD_PER_HOUR["ml.p4d.24xlarge"]
    with mock.patch.dict(hardware.INSTANCES, extra), mock.patch.dict(
            prices.ON_DEMAND_USD_PER_HOUR, {name: price for name in extra}):
        yield


def test_the_definition_is_small_and_grows_by_no_preset_nor_instance_type():
    base = definition_bytes()
    with more_presets(synthetic_presets(MORE)):
        with_presets = definition_bytes()
        with more_instance_types(MORE):
            with_types = definition_bytes()
    print("training definition: %d bytes; %d more presets: +%d; and %d more GPU types: +%d"
          % (base, MORE, with_presets - base, MORE, with_types - with_presets))
    assert base <= DEFINITION_MAX_BYTES, base
    assert (with_presets - base) / MORE <= PRESET_MAX_BYTES
    assert (with_types - with_presets) / MORE <= PRESET_MAX_BYTES
    assert with_types <= DEFINITION_MAX_BYTES


def test_a_new_preset_is_planned_by_the_gate():
    """A preset added to the table only: the gate gives the job its configuration, and refuses it where the
    planner says it cannot run, as for the preset it copies."""
    context = gate.Context(gate.Deployment.of(Settings()))
    extra = collections.OrderedDict([("gpt-13b-copy", presets.GPT_PRESETS["gpt-13b"])])
    single_small = {"preset": "gpt-13b-copy", "strategy": "single", "instance_type": "ml.g5.2xlarge",
                    "hyperparameters": {"recompute": True}}
    smp = {"preset": "gpt-13b-copy", "strategy": "smp", "instance_type": "ml.p4de.24xlarge",
           "mp_parameters": {"partitions": 4, "microbatches": 1},
           "hyperparameters": {"global_batch_size": 2, "seq_len": 1024}}
    with more_presets(extra):
        with pytest.raises(gate.Refusal, match="lmstack.plan: single on 1 x ml.g5.2xlarge: needs"):
            gate.decide(single_small, context)
        planned = gate.decide(smp, context).plan
    assert planned["model_config"] == presets.model_config("gpt-13b")
    with pytest.raises(gate.Refusal, match="preset must be one of"):
        gate.decide(smp, context)


@pytest.mark.parametrize("preset", list(presets.ALL_PRESETS))
def test_each_preset_configuration_fits_a_sagemaker_hyperparameter(preset):
    """HyperParameters values are at most 2500 characters (botocore's sagemaker model: HyperParameterValue)."""
    assert len(json.dumps(presets.model_config(preset))) <= 2500
