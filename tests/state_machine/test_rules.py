"""One rule table: a rule every job obeys is one entry in `lm.spec.job.job_rules`, enforced on every path.

The test adds one entry to `job_rules` in a temporary copy of lm/spec/job.py, runs the copy in
place of the module, and sees the new rule reject the same input, with the same message, in the
state machine's validation on moto, in `lmstack.start`, in `controlplane.planner` and in the
deployment settings (all of which read it through `controlplane.rules.cross_field_rules` or
directly); the same input passes everywhere without it.
"""
import inspect
import re

import pytest
from state_machine import harness

from controlplane import gate, planner
from controlplane import rules
from lm.spec import conditions
from lm.spec import job
from lmstack import start
from controlplane import inputs
from stacks import settings
from stacks.settings import Settings, SettingsError
from stacks.state_machine import jobs

# botocore's sagemaker service model, shape EndpointName.
ENDPOINT_PATTERN = r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"
ENDPOINT_MAX = 63

NEW_RULE = '''
    found.append(rule("strategy.mwms.instance_count", All((Is(STRATEGY_FIELD, "mwms"), Above(INSTANCE_COUNT_FIELD, 4))),
                      "strategy mwms runs on at most 4 instances here, got instance_count={value}",
                      subject=INSTANCE_COUNT_FIELD))
'''
MESSAGE = "strategy mwms runs on at most 4 instances here, got instance_count=5"
# 160 sequences split evenly over 5 and 4 hosts of 8 GPUs (the Validate stage and lmstack.start check it).
RUN = {"strategy": "mwms", "instance_type": "ml.p4d.24xlarge", "instance_count": 5,
       "hyperparameters": {"global_batch_size": 160}}


@pytest.fixture
def with_new_rule(tmp_path, monkeypatch):
    source = inspect.getsource(job)
    end = "\n    return found\n"
    at = source.index(end, source.index("\ndef job_rules("))
    copy = tmp_path / "job.py"
    copy.write_text(source[:at] + "\n" + NEW_RULE + source[at + 1:])
    # The gate's code is staged from the tree with this edit, as `cdk synth` would after it.
    monkeypatch.setitem(harness.EDITED_SOURCES, job.__file__, copy.read_text())
    saved = dict(vars(job))
    exec(compile(copy.read_text(), str(copy), "exec"), vars(job))
    yield
    vars(job).clear()
    vars(job).update(saved)


def _rejections(execution_input, deployment, name):
    """What each path says about `execution_input` (None: accepted)."""
    found = {}
    run = deployment.run(execution_input, name=name)
    found["asl"] = run.description.get("cause") if run.status == "FAILED" else None
    try:
        start.validate_input(execution_input, Settings())
        found["start"] = None
    except start.StartError as error:
        found["start"] = str(error)
    found["plan"] = planner.cannot_run(execution_input["strategy"], execution_input["instance_type"],
                                    execution_input["instance_count"])
    try:
        Settings(default_strategy="mwms", default_instance_type="ml.p4d.24xlarge", default_instance_count=5)
        found["settings"] = None
    except SettingsError as error:
        found["settings"] = str(error)
    return found


def test_without_the_rule_every_path_accepts_the_run(deployment):
    assert _rejections(RUN, deployment, "without") == {"asl": None, "start": None, "plan": None, "settings": None}


def test_a_rule_added_to_the_table_is_enforced_on_every_path(with_new_rule, make_deployment):
    deployment = make_deployment()  # generated after the rule was added
    found = _rejections(RUN, deployment, "five")
    assert found["asl"] == MESSAGE
    assert found["start"] == MESSAGE
    assert found["plan"] == MESSAGE
    assert "lmstack.default_instance_count: " + MESSAGE in found["settings"]
    assert deployment.jobs.created == []
    assert _rejections(dict(RUN, instance_count=4), deployment, "four") == {
        "asl": None, "start": None, "plan": None, "settings": found["settings"]}


def test_start_refuses_what_the_state_machine_refuses_with_its_words(deployment):
    """A run the planner says cannot fit: the gate refuses it for the state machine and for lmstack.start, in
    the same words, before anything starts."""
    execution_input = {"strategy": "single", "instance_type": "ml.g5.2xlarge", "instance_count": 1,
                       "preset": "gpt-1.3b"}
    run = deployment.run(execution_input, name="plan-gate")
    with pytest.raises(start.StartError) as error:
        start.validate_input(execution_input, Settings())
    assert (run.status, run.description.get("error"), run.description.get("cause")) == (
        "FAILED", gate.PLAN_REJECTED, str(error.value))
    assert str(error.value).startswith("lmstack.plan: single on 1 x ml.g5.2xlarge: needs ")
    assert deployment.jobs.created == []


# ---- names (controlplane.rules.name_rules) ----

ENDPOINT = rules.name_rules(Settings().name_prefix)[0]


@pytest.mark.parametrize("value, ok", [("gpt-125m", True), ("a" * ENDPOINT.max_length, True), ("A1", True),
                                       ("a" * (ENDPOINT.max_length + 1), False), ("my_model", False),
                                       ("gpt-", False), ("", False), ("gpt 1", False)])
def test_endpoint_name_rule(value, ok):
    assert (rules.name_problem(ENDPOINT, value) is None) == ok
    assert rules.name_problem(ENDPOINT, 7) is not None  # not a string (the schema refuses it first)
    full = "%s-%s" % (Settings().name_prefix, value)
    # the rule is SageMaker's: the EndpointName shape's pattern and maximum length
    assert ok == bool(re.fullmatch(ENDPOINT_PATTERN, full) and len(full) <= ENDPOINT_MAX), full


def test_names_the_state_machine_builds_fit_for_the_longest_prefix():
    """The job, model and endpoint-config names are made by the state machine from the prefix, which the
    settings bound: checked here at synth time, for the most attempts a run makes (every fallback type's)."""
    prefix = "p" * settings._NAME_PREFIX_MAX
    most_attempts = jobs.MAX_ATTEMPTS * (1 + inputs.MAX_FALLBACK_INSTANCE_TYPES)
    for kind in (jobs.TRAIN, jobs.PREPARE):
        assert rules.job_name_length(prefix, kind.token, most_attempts) <= rules.SAGEMAKER_NAME_MAX
    assert len(prefix) + 1 + rules.JOB_NAME_HASH_LENGTH <= rules.SAGEMAKER_NAME_MAX  # model, endpoint config
    endpoint = rules.name_rules(prefix)[0]
    default = inputs.schema(Settings(name_prefix=prefix))
    assert rules.name_problem(endpoint, inputs.defaults(default)["deploy"]["endpoint_name"]) is None


def test_a_bad_name_is_refused_with_the_same_message_by_validate_and_start(deployment):
    execution_input = {"deploy": {"endpoint_name": "my_model"}}
    run = deployment.run(execution_input, name="bad-endpoint")
    assert run.description.get("error") == conditions.INVALID
    with pytest.raises(start.StartError) as error:
        start.validate_input(execution_input, Settings())
    assert run.description["cause"] == str(error.value) == rules.name_problem(ENDPOINT, "my_model")
    assert deployment.jobs.created == []


def test_the_job_names_built_on_moto_are_as_long_as_the_rule_counts(make_deployment):
    """`job_name_length` is the state machine's own template: a run with the longest prefix shows it."""
    from state_machine.harness import StandInSettings

    prefix = "p" * settings._NAME_PREFIX_MAX
    deployment = make_deployment(StandInSettings(name_prefix=prefix))
    run = deployment.run({}, name="long-prefix")
    assert run.status == "SUCCEEDED", run.description.get("cause")
    assert len(run.output["job_name"]) == rules.job_name_length(prefix, jobs.TRAIN.token, 1)
