"""docs/fork.md, "Add a hyperparameter": one `_hp(...)` line in `lm.spec.job.HYPERPARAMETERS`, and
every consumer the checklist names picks it up with no other edit.

The line is added to a copy of lm/spec/job.py run in the module's place (`recipe`); the modules
that build something from the table when imported (`lm.training.train`'s `Hyperparameters`
dataclass and argument parser, `lmstack.start`'s `--hp` help) are imported afresh, as the next
process would. The state machine and the gate's code are staged after the edit (`make_deployment`) and run on moto.
Without the line, each of them refuses the name as unknown.
"""
import contextlib
import dataclasses
import io
import json

import pytest
from state_machine.harness import StandInSettings

from controlplane import request
from controlplane import presets
from lm.spec import job

from . import recipe

NAME = "z_loss"
# PaLM's auxiliary loss on log(Z) of the softmax: a float with bounds, the kind of line the checklist adds.
ENTRY = '    _hp("z_loss", float, 0.0, 0.0, 1.0, help="weight of the z-loss, log(Z)^2 of the softmax (PaLM)"),\n'
TABLE_END = "])\n\n\ndef validate_hyperparameters("
GOOD, BAD = 0.25, 1.5
MESSAGE = "hyperparameters.z_loss must be between 0.0 and 1.0, got 1.5"  # lm.spec.fields.range_message
# A dry run of the deployment's default preset, with the configuration the control plane resolves for it.
DRY_RUN = ["--dry-run", "--instance-type", StandInSettings.default_instance_type] + presets.train_arguments(
    StandInSettings.default_preset)


@pytest.fixture
def with_entry(monkeypatch):
    """(lm.training.train, lmstack.start) after the line was added to the table."""
    recipe.run_in_place(monkeypatch, job, recipe.edited(job, (TABLE_END, ENTRY, True)))
    return recipe.reimport(monkeypatch, "lm.training.train", "lmstack.start")


def encoded(value):
    return request.encode_hyperparameters({NAME: value})[NAME]


def refusals(value, deployment, train, start):
    """What each path says about hyperparameters.z_loss = `value` (None: accepted)."""
    execution_input = {"hyperparameters": {NAME: value}}
    run = deployment.run(execution_input, name="z-loss-%s" % str(value).replace(".", "-"))
    return {
        "validate": run.description.get("cause") if run.status == "FAILED" else None,
        "start": recipe.rejection(lambda: start.validate_input(execution_input, StandInSettings()), start.StartError),
        "runtime": recipe.rejection(lambda: job.validate_hyperparameters({NAME: value}), ValueError),
        "train": recipe.rejection(lambda: train.parse_args(["--" + NAME, encoded(value)] + DRY_RUN), ValueError),
    }


def test_without_the_line_every_path_refuses_the_name(deployment):
    from lm.training import train
    from lmstack import start

    found = refusals(GOOD, deployment, train, start)
    assert found["validate"].startswith("hyperparameters has an unknown field; allowed: ")
    assert found["start"].startswith("hyperparameters has an unknown field; allowed: ")
    assert found["start"].endswith("got hyperparameters.%s" % NAME)
    assert found["runtime"].startswith("unknown hyperparameters %s; allowed: " % NAME)
    assert found["train"].startswith("unknown hyperparameters --%s" % NAME)
    assert NAME not in {field.name for field in dataclasses.fields(train.Hyperparameters)}


def test_one_line_in_the_table_reaches_every_consumer(with_entry, make_deployment):
    train, start = with_entry
    deployment = make_deployment()  # generated after the edit

    # lm.training.train: the frozen dataclass, its command line (as the toolkit passes values) and --help
    field = next(field for field in dataclasses.fields(train.Hyperparameters) if field.name == NAME)
    assert field.type is float
    hyperparameters, _ = train.parse_args(["--" + NAME, encoded(GOOD)] + DRY_RUN)
    assert getattr(hyperparameters, NAME) == GOOD
    assert getattr(train.parse_args(DRY_RUN)[0], NAME) == 0.0
    assert "--%s VALUE" % NAME in train.build_parser().format_help()

    # a good value passes every path, a bad one is refused on each with the table's message
    assert refusals(GOOD, deployment, train, start) == dict.fromkeys(("validate", "start", "runtime", "train"))
    assert refusals(BAD, deployment, train, start) == dict.fromkeys(("validate", "start", "runtime", "train"), MESSAGE)
    assert len(deployment.jobs.created) == 1  # the good value's execution; the bad one's made no job

    # lmstack.start --hp, and the request: encoded as the SageMaker Python SDK encodes it
    sdk = pytest.importorskip("sagemaker.estimator")
    expected = sdk.EstimatorBase._json_encode_hyperparameters({NAME: GOOD})[NAME]
    execution_input = start.build_input(start.parse_args(["--hp", "%s=%s" % (NAME, json.dumps(GOOD))]))
    assert execution_input == {"hyperparameters": {NAME: GOOD}}
    assert NAME in _start_help(start)
    start.validate_input(execution_input, StandInSettings())
    built = start.training_request(execution_input, StandInSettings(), "run-1")["HyperParameters"]
    assert built[NAME] == expected == "0.25"
    run = deployment.run(execution_input, name="with-hp")
    assert run.status == "SUCCEEDED", run.description.get("cause")
    (_, _, sent), = run.calls("createTrainingJob")
    assert sent["HyperParameters"][NAME] == expected
    default = deployment.run({}, name="default")
    (_, _, sent), = default.calls("createTrainingJob")
    assert sent["HyperParameters"][NAME] == encoded(0.0) == "0.0"


def _start_help(start):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        start.parse_args(["--help"])
    return out.getvalue()
