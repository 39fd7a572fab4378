"""The request builder (`controlplane.request`) and the generated definition send the same request.

For each job kind and strategy, the execution runs on moto and its CreateTrainingJob
request is taken from the history; the builder is then called with the concrete values of
that execution (the input with its defaults, the job name, the execution name) and must
return the same request, key by key. The definition is generated from the same builder with
markers in place of those values, so this shows that turning markers into `.$` keys (the
only thing the generator does) keeps every value.
"""
import hashlib
import json

import pytest
from state_machine.harness import StandInSettings

from lm.spec import job
from controlplane import request
from controlplane import inputs
from stacks.state_machine import jobs, render, training

INSTANCE_TYPE = "ml.p4d.24xlarge"


def concrete_request(deployment, run, kind, execution_input):
    """What the builder returns for this run's concrete values, placeholders filled as deployed."""
    settings = deployment.settings
    config = inputs.with_defaults(inputs.schema(settings), execution_input)
    run_id = hashlib.md5(run.arn.encode()).hexdigest()
    values = jobs.concrete_values(
        kind, settings, config, job_name="%s-%s-%s-1" % (settings.name_prefix, kind.token, run_id),
        execution_name=run.arn.split(":")[-1], dataset_key=training.concrete_dataset_key(config))
    return json.loads(render(request.create_training_job_request(values), deployment.values))


def assert_equal_key_by_key(ours, theirs):
    assert sorted(ours) == sorted(theirs)
    for key in ours:
        if key == "HyperParameters":
            assert sorted(ours[key]) == sorted(theirs[key])
            for name, value in ours[key].items():
                # States.JsonToString writes objects without spaces, json.dumps with them.
                decoded = job.decode_hyperparameter(value)
                if isinstance(decoded, dict):
                    assert decoded == json.loads(theirs[key][name]), name
                elif isinstance(decoded, int) and decoded < 0:
                    # moto's ASL grammar lexes a negative number in the definition as a float
                    # (its INT token has no sign), so the default -1 arrives as -1.0 there.
                    assert theirs[key][name] in (value, json.dumps(float(decoded))), name
                else:
                    assert value == theirs[key][name], name
        else:
            assert ours[key] == theirs[key], key


def _created(run):
    assert run.status == "SUCCEEDED", (run.description.get("error"), run.description.get("cause"))
    requests = [parameters for _, action, parameters in run.calls("createTrainingJob")]
    return requests


@pytest.mark.parametrize("strategy", job.STRATEGIES)
def test_the_definition_sends_what_the_builder_builds_for_each_strategy(deployment, strategy):
    execution_input = {"preset": "gpt-125m", "strategy": strategy, "instance_type": INSTANCE_TYPE,
                       "instance_count": 1 if strategy == "single" else 2, "spot": strategy == "horovod",
                       "hyperparameters": {"max_steps": 20, "learning_rate": 0.001, "global_batch_size": 32,
                                           "recompute": strategy != "smp"}}
    run = deployment.run(execution_input, name="request-%s" % strategy)
    sent, = _created(run)
    assert_equal_key_by_key(concrete_request(deployment, run, jobs.TRAIN, execution_input), sent)


@pytest.mark.parametrize("raw", [{}, {"raw_s3_uri": "s3://lmstack-artifacts/raw/pile/"}], ids=["efs", "s3"])
def test_the_definition_sends_what_the_builder_builds_for_the_prepare_job(make_deployment, raw):
    deployment = make_deployment(StandInSettings(az_count=3), prepared=())
    execution_input = {"prepare": dict(raw, enabled=True, force=True, instance_count=2,
                                       hyperparameters={"seq_len": 512, "tokenizer": "/tokenizers/gpt2.json"})}
    run = deployment.run(execution_input, name="request-prepare")
    prepare, train = _created(run)
    assert_equal_key_by_key(concrete_request(deployment, run, jobs.PREPARE, execution_input), prepare)
    assert_equal_key_by_key(concrete_request(deployment, run, jobs.TRAIN, execution_input), train)


def test_a_changed_value_is_found():
    """The comparison can fail: one hyperparameter and one top-level key changed."""
    ours = {"HyperParameters": {"max_steps": "20", "mp_parameters": '{"partitions": 2}'}, "RoleArn": "a"}
    assert_equal_key_by_key(ours, {"HyperParameters": {"max_steps": "20", "mp_parameters": '{"partitions":2}'},
                                   "RoleArn": "a"})
    with pytest.raises(AssertionError, match="max_steps"):
        assert_equal_key_by_key(ours, {"HyperParameters": {"max_steps": "21", "mp_parameters": '{"partitions": 2}'},
                                       "RoleArn": "a"})
    with pytest.raises(AssertionError, match="RoleArn"):
        assert_equal_key_by_key(ours, dict(ours, RoleArn="b"))


def test_markers_resolve_to_what_literals_build():
    """The builder's marker helpers: the same call with literals, or with markers resolved later."""
    value_at = request.values_at({"name": "job-1", "seconds": 60}, {"Execution": {"Name": "run-1"}})
    marked = request.text("s3://${Bucket}/{}/{}/model", request.Path("$$.Execution.Name"), request.Path("$.name"))
    assert marked == request.Format("s3://${Bucket}/{}/{}/model", (request.Path("$$.Execution.Name"),
                                                                   request.Path("$.name")))
    assert request.resolve(marked, value_at) == request.text("s3://${Bucket}/{}/{}/model", "run-1", "job-1")
    assert request.text("a{}b{}", "x", request.Path("$.name")) == request.Format("axb{}", (request.Path("$.name"),))
    assert request.resolve(request.add(request.Path("$.seconds"), 5), value_at) == 65
    assert request.resolve(request.json_text(request.Path("$.name")), value_at) == '"job-1"'
    with pytest.raises(ValueError, match="2 holes, got 1"):
        request.text("{}{}", "x")
    with pytest.raises(ValueError, match="spot"):
        request.stopping_condition(3600, request.Path("$.config.spot"))
