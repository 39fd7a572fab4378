"""docs/fork.md, "Add a strategy", steps 1-3: a strategy `solo` (a copy of the single-device adapter
under a new name, on the tf211 image, restricted to two instance types) and what picks it up with
no other edit: the Validate stage's `strategy` choice and the rules generated per strategy
(`controlplane.rules.cross_field_rules`: its image must be built, its instance types),
`lmstack.start`, the `default_strategy` setting, the request, and `lm.training.train`, which
trains two steps with it.

The edits are made to copies of lm/spec/job.py, controlplane/base_images.py and
lm/distributed/__init__.py run in the modules' places, plus the new module lm/distributed/solo.py
(`recipe`); the modules that bind the tables
when imported (`stacks.settings`, `lmstack.start`, `lm.training.train`) are imported afresh.
`lm.spec.job.processes_per_host` needs no edit (one process per host is its default), nor
`controlplane.request.distribution_hyperparameters` (the SDK adds nothing for a strategy without a
launcher). Step 4 (the planner) is not performed: `controlplane.planner` lays out a strategy it does
not know as data parallelism over every GPU, so its estimates for `solo` are not this adapter's.
"""
import os

import pytest
from state_machine.harness import StandInSettings

from controlplane import base_images, request
from controlplane import planner, rules
from lm.distributed import single
from controlplane import presets
from lm.spec import job
from stacks.state_machine.names import image_placeholder

from . import recipe

STRATEGY, RUNTIME, INSTANCE_TYPES = "solo", "tf211", ("ml.g5.xlarge", "ml.g5.2xlarge")
EDITS = (('STRATEGIES = ("single", "mwms", "horovod", "smddp", "smp")',
          'STRATEGIES = ("single", "mwms", "horovod", "smddp", "smp", "solo")'),
         ('STRATEGY_INSTANCE_TYPES = {"smddp": SMDDP_INSTANCE_TYPES, "smp": SMP_INSTANCE_TYPES}',
          'STRATEGY_INSTANCE_TYPES = {"smddp": SMDDP_INSTANCE_TYPES, "smp": SMP_INSTANCE_TYPES, '
          '"solo": ("ml.g5.xlarge", "ml.g5.2xlarge")}'))
RUNTIME_EDIT = ('"mwms": "tfcurrent", "single": "tfcurrent"}', '"mwms": "tfcurrent", "single": "tfcurrent", "solo": "tf211"}')
ADAPTER_ENTRY = '    "solo": ("lm.distributed.solo", "SoloStrategy"),\n'
RUN = {"strategy": STRATEGY, "instance_type": "ml.g5.2xlarge", "instance_count": 1, "preset": "tiny"}
ELSEWHERE = dict(RUN, instance_type="ml.p3.2xlarge")
INSTANCE_TYPE_MESSAGE = "strategy solo runs only on instance_type ml.g5.xlarge, ml.g5.2xlarge (the SageMaker support list)"
RUNTIME_MESSAGE = "strategy solo needs the tf211 image, which this deployment does not build (runtimes: tfcurrent)"
TINY = {"preset": "tiny", "global_batch_size": 4, "max_steps": 2, "warmup_steps": 1, "log_every": 1,
        "eval_every": 0, "eval_batches": 1, "checkpoint_every": 0, "xla": False}


@pytest.fixture
def with_strategy(monkeypatch, tmp_path):
    """(stacks.settings, lmstack.start, lm.training.train) after steps 1-3."""
    from lm import distributed

    recipe.run_in_place(monkeypatch, job, recipe.replaced(job, *EDITS))
    recipe.run_in_place(monkeypatch, base_images, recipe.replaced(base_images, RUNTIME_EDIT))
    adapter = recipe.replaced(single, ('"""One process, one device', '"""A copy of lm.distributed.single: one device'),
                              ("class SingleStrategy(", "class SoloStrategy("), ('name = "single"', 'name = "solo"'))
    recipe.add_module(monkeypatch, "lm.distributed.solo", adapter, str(tmp_path / "solo.py"))
    recipe.run_in_place(monkeypatch, distributed, recipe.edited(distributed, ("}\nassert set(ADAPTERS)", ADAPTER_ENTRY,
                                                                              True)))
    return recipe.reimport(monkeypatch, "stacks.settings", "lmstack.start", "lm.training.train")


def train_args(data_dir, tmp_path, **hyperparameters):
    args = ["--data-dir", data_dir, "--checkpoint-dir", str(tmp_path / "ckpt"), "--export-dir", str(tmp_path / "model")]
    for name, value in presets.resolve(dict(TINY, **hyperparameters)).items():
        args += ["--" + name, request.encode_hyperparameters({name: value})[name]]
    return args


def test_without_the_edits_every_consumer_refuses_the_strategy(deployment, data_dir, tmp_path, capsys):
    from lm import distributed
    from lm.training import train
    from lmstack import start
    from stacks import settings

    choice = "strategy must be one of single, mwms, horovod, smddp, smp"
    run = deployment.run(RUN, name="before")
    assert run.description.get("cause", "").startswith(choice)
    assert recipe.rejection(lambda: start.validate_input(RUN, settings.Settings()), start.StartError).startswith(choice)
    assert "default_strategy" in recipe.rejection(lambda: settings.Settings(default_strategy=STRATEGY),
                                                  settings.SettingsError)
    assert recipe.rejection(lambda: distributed.get_strategy(STRATEGY), ValueError).startswith(choice)
    assert train.main(train_args(data_dir, tmp_path, strategy=STRATEGY)) == 2
    assert "hyperparameters.strategy must be one of" in capsys.readouterr().err
    assert not [found for found in rules.cross_field_rules(("tfcurrent",)) if STRATEGY in found.name]


def test_a_strategy_added_by_the_checklist_is_picked_up(with_strategy, make_deployment, data_dir, tmp_path, capsys):
    settings, start, train = with_strategy
    deployment = make_deployment()  # generated after the edits

    # the gate (the Validate state): the choice, the rule of its instance types; the request of its image
    run = deployment.run(RUN, name="solo")
    assert run.status == "SUCCEEDED", run.description.get("cause")
    (_, _, sent), = run.calls("createTrainingJob")
    assert sent["AlgorithmSpecification"]["TrainingImage"] == deployment.values[image_placeholder(RUNTIME)]
    built = start.training_request(RUN, StandInSettings(), "solo")
    per_job = ("sagemaker_job_name", "model_dir")  # the job's name, which only the execution knows
    assert {key: value for key, value in sent["HyperParameters"].items() if key not in per_job} == {
        key: value for key, value in built["HyperParameters"].items() if key not in per_job}
    assert sent["HyperParameters"]["strategy"] == '"solo"' and "sagemaker_mpi_enabled" not in sent["HyperParameters"]
    # The gate's rules (controlplane.rules.cross_field_rules, which hold job_rules) refuse it.
    elsewhere = deployment.run(ELSEWHERE, name="solo-p3")
    assert elsewhere.description.get("error") == "InvalidInput"
    assert INSTANCE_TYPE_MESSAGE in elsewhere.description["cause"]

    # the rules generated per strategy, the planner's refusal (job_rules), lmstack.start
    assert [found.message for found in rules.cross_field_rules(("tfcurrent",))
            if found.name == "strategy.solo.runtime"] == [RUNTIME_MESSAGE]
    assert planner.cannot_run(STRATEGY, "ml.p3.2xlarge") == INSTANCE_TYPE_MESSAGE
    assert planner.cannot_run(STRATEGY, "ml.g5.2xlarge") is None
    start.validate_input(RUN, settings.Settings())
    assert recipe.rejection(lambda: start.validate_input(ELSEWHERE, settings.Settings()),
                            start.StartError) == elsewhere.description["cause"]
    assert recipe.rejection(lambda: start.validate_input(RUN, settings.Settings(runtimes=("tfcurrent",))),
                            start.StartError) == RUNTIME_MESSAGE

    # the default_strategy setting
    settings.Settings(default_strategy=STRATEGY)
    assert "lmstack.default_instance_type: " + INSTANCE_TYPE_MESSAGE in recipe.rejection(
        lambda: settings.Settings(default_strategy=STRATEGY, default_instance_type="ml.p3.2xlarge"),
        settings.SettingsError)
    assert "default_strategy 'solo' runs on runtime 'tf211', which is not built" in recipe.rejection(
        lambda: settings.Settings(default_strategy=STRATEGY, runtimes=("tfcurrent",)), settings.SettingsError)

    # lm.training.train: its adapter, two steps with it
    from lm import distributed
    from lm.distributed import base

    assert isinstance(distributed.get_strategy(STRATEGY), base.Strategy)
    capsys.readouterr()
    assert train.main(train_args(data_dir, tmp_path, strategy=STRATEGY)) == 0
    output = capsys.readouterr()
    assert "with solo on 1 device(s): 2 steps" in output.out + output.err
    assert os.path.isdir(str(tmp_path / "model"))
