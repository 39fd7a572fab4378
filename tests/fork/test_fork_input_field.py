"""docs/fork.md, "Add an input field": `volume_size_gb`, the ML storage volume of each training
instance (CreateTrainingJob ResourceConfig.VolumeSizeInGB, today the constant
`controlplane.request.VOLUME_SIZE_GB`).

Step 1, one `Field` in `controlplane.inputs.schema`: the gate (the Validate state's Lambda function, run
from its staged code, and `lmstack.start`) accepts it and checks its type and bounds with the same message,
but it reaches no job. Step 2, a
field of `controlplane.request.TrainingJob` and its member of the request, and its run-time value
in `stacks.state_machine.jobs.job_values`: the executed request carries it, as does
`lmstack.start`'s view of the request. The edits are made to copies of the three modules' sources
run in their places (`recipe`); the state machine is generated after them. Without the field the
input is refused as unknown.
"""
from controlplane import inputs, request
from lmstack import start
from state_machine.harness import StandInSettings
from stacks.state_machine import jobs

from . import recipe

NAME, GIVEN = "volume_size_gb", 200
FIELD = ('        Field("volume_size_gb", int, request.VOLUME_SIZE_GB, 1, 16384,\n'
         '              help="the ML storage volume of each training instance, in GB"),\n')
FIELD_AT = "        # ResourceConfig.TrainingPlanArn"
MEMBER = "    volume_size_gb: Any = None      # ResourceConfig.VolumeSizeInGB (None: VOLUME_SIZE_GB)\n"
MEMBER_AT = "    mlflow_arn: Any = None"
RESOURCE = ('("VolumeSizeInGB", VOLUME_SIZE_GB)])',
            '("VolumeSizeInGB", VOLUME_SIZE_GB if j.volume_size_gb is None else j.volume_size_gb)])')
VALUE = '        volume_size_gb=value_at("$.config.volume_size_gb") if kind is TRAIN else None,\n'
VALUE_AT = "        mlflow_arn=settings.mlflow_resource_arn if kind is not PREPARE else None,"


def step_1(monkeypatch):
    recipe.run_in_place(monkeypatch, inputs, recipe.edited(inputs, (FIELD_AT, FIELD, True)))


def step_2(monkeypatch):
    recipe.run_in_place(monkeypatch, request, recipe.replaced(request, (MEMBER_AT, MEMBER + MEMBER_AT), RESOURCE))
    recipe.run_in_place(monkeypatch, jobs, recipe.edited(jobs, (VALUE_AT, VALUE, True)))


def start_says(execution_input):
    return recipe.rejection(lambda: start.validate_input(execution_input, StandInSettings()), start.StartError)


def requested_volume(execution_input):
    return start.training_request(execution_input, StandInSettings(), "run-1")["ResourceConfig"]["VolumeSizeInGB"]


def test_without_the_field_it_is_unknown(deployment):
    run = deployment.run({NAME: GIVEN})
    assert run.description.get("cause", "").startswith("the input has an unknown field; allowed: ")
    assert start_says({NAME: GIVEN}).startswith("the input has an unknown field; allowed: ")
    assert start_says({NAME: GIVEN}).endswith("got %s" % NAME)


def test_step_1_checks_the_field_but_reaches_no_job(monkeypatch):
    step_1(monkeypatch)
    assert start_says({NAME: GIVEN}) is None
    assert start_says({NAME: "big"}).startswith("volume_size_gb must be an integer, got ")
    assert requested_volume({NAME: GIVEN}) == request.VOLUME_SIZE_GB  # step 2 is what carries it


def test_steps_1_and_2_carry_the_field_into_the_request(monkeypatch, make_deployment):
    step_1(monkeypatch)
    step_2(monkeypatch)
    deployment = make_deployment()  # generated after the edits

    for index, (value, message) in enumerate([("big", "volume_size_gb must be an integer, got "),
                                              (0, "volume_size_gb must be between 1 and 16384, got 0"),
                                              (2.5, "volume_size_gb must be an integer, got 2.5")]):
        run = deployment.run({NAME: value}, name="bad-%d" % index)
        assert run.description.get("error") == "InvalidInput"
        assert run.description["cause"].startswith(message) and start_says({NAME: value}).startswith(message)
    assert deployment.jobs.created == []

    assert start_says({NAME: GIVEN}) is None
    assert requested_volume({NAME: GIVEN}) == GIVEN
    assert requested_volume({}) == request.VOLUME_SIZE_GB
    run = deployment.run({NAME: GIVEN, "prepare": {"enabled": True, "force": True}}, name="given")
    assert run.status == "SUCCEEDED", run.description.get("cause")
    prepare, train = [sent for _, _, sent in run.calls("createTrainingJob")]
    assert train["ResourceConfig"]["VolumeSizeInGB"] == GIVEN
    assert prepare["ResourceConfig"]["VolumeSizeInGB"] == request.VOLUME_SIZE_GB  # a training job's field only
    default = deployment.run({}, name="default")
    (_, _, sent), = default.calls("createTrainingJob")
    assert sent["ResourceConfig"]["VolumeSizeInGB"] == request.VOLUME_SIZE_GB

