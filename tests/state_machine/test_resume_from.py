"""resume_from, executed on moto (issue 24.6): a failed run's training is not lost.

An execution name cannot be used again for 90 days (StartExecution, Step Functions API reference) and
each execution trained under checkpoints/<its name>/, so no new execution could reach the checkpoints of
a failed one. A failed run's cause now names its checkpoint prefix; resume_from points the training job's
CheckpointConfig at it (SageMaker copies that prefix to /opt/ml/checkpoints when the job starts, and
lm.training.train resumes from the newest checkpoint there, refusing one of another model or dataset:
tests/training/test_resume.py). Every request passes botocore's validation and tests/aws_rules.py.
"""
import json

import pytest
from state_machine.harness import SUCCESS, invalid_sagemaker_requests

from lm.spec import conditions
from controlplane import request
from controlplane import inputs
from stacks.state_machine import jobs, render

FAILED = SUCCESS[:3] + [("Failed", "Failed", {"FailureReason": "InternalServerError: the instance was lost"})]
CHECKPOINTS = "s3://lmstack-artifacts/checkpoints/%s/"


def _failure(run):
    return run.description.get("error"), run.description.get("cause"), run.states_entered()[-6:]


def _tags(sent):
    return {tag["Key"]: tag["Value"] for tag in sent["Tags"]}


def _training_request(run):
    return [sent for _, _, sent in run.calls("createTrainingJob") if _tags(sent)[request.KIND_TAG] == "train"][-1]


@pytest.mark.slow
def test_a_failed_run_says_how_to_resume_and_the_next_run_continues_its_checkpoints(deployment):
    deployment.jobs.scripts.append(FAILED)
    failed = deployment.run({}, name="first-try")
    assert failed.description["error"] == "TrainJobFailed", _failure(failed)
    assert failed.description["cause"].endswith(
        'Its checkpoints are kept: to continue from the newest, start a new execution with the same input plus '
        '"resume_from": "first-try"')
    sent = _training_request(failed)
    assert sent["CheckpointConfig"]["S3Uri"] == CHECKPOINTS % "first-try"
    assert _tags(sent)[request.CHECKPOINTS_TAG] == "first-try"
    assert sent["RetryStrategy"] == {"MaximumRetryAttempts": request.INTERNAL_ERROR_RETRIES}

    deployment.jobs.scripts.append(FAILED)
    second = deployment.run({"resume_from": "first-try"}, name="second-try")
    sent = _training_request(second)
    assert sent["CheckpointConfig"] == {"S3Uri": CHECKPOINTS % "first-try", "LocalPath": "/opt/ml/checkpoints"}
    assert _tags(sent)[request.CHECKPOINTS_TAG] == "first-try" and _tags(sent)[request.EXECUTION_TAG] == "second-try"
    # The prefix is still the first run's: that is what the next try names.
    assert second.description["cause"].endswith('"resume_from": "first-try"')
    assert invalid_sagemaker_requests(second) == []

    third = deployment.run({"resume_from": "first-try"}, name="third-try")
    assert third.status == "SUCCEEDED", _failure(third)
    assert _training_request(third)["CheckpointConfig"]["S3Uri"] == CHECKPOINTS % "first-try"

    # second-try wrote under first-try/: its own name is no checkpoint prefix.
    refused = deployment.run({"resume_from": "second-try"}, name="fourth-try")
    assert refused.description["error"] == conditions.INVALID and refused.calls("createTrainingJob") == []
    assert "s3://lmstack-artifacts/checkpoints/second-try/" in refused.description["cause"]


@pytest.mark.slow
@pytest.mark.parametrize("resume_from", ["never-ran", "../first-try", ""])
def test_resume_from_that_names_no_checkpoint_prefix_of_this_stack_is_refused_before_any_job(deployment,
                                                                                          resume_from):
    run = deployment.run({"resume_from": resume_from}, name="resume-unknown")
    assert run.status == "FAILED" and run.description["error"] == conditions.INVALID, _failure(run)
    assert run.description["cause"].startswith("resume_from must name the checkpoint prefix of an earlier execution")
    assert run.description["cause"].endswith("got %s" % resume_from)
    assert run.calls("createTrainingJob") == []
    assert invalid_sagemaker_requests(run) == []  # Search's Filter.Value may not be empty


@pytest.mark.slow
def test_resume_from_a_prefix_a_job_is_writing_to_is_refused(deployment):
    """Two jobs syncing one checkpoint prefix would overwrite each other's files."""
    config = inputs.with_defaults(inputs.schema(deployment.settings), {})
    busy = jobs.concrete_values(jobs.TRAIN, deployment.settings, config, job_name="lmstack-train-busy-1",
                                execution_name="still-running")
    deployment.jobs.scripts.insert(0, [("InProgress", "Training", {})])
    deployment.sagemaker.create_training_job(**json.loads(render(request.create_training_job_request(busy),
                                                                 deployment.values)))
    run = deployment.run({"resume_from": "still-running"}, name="resume-busy")
    assert run.status == "FAILED" and run.description["error"] == conditions.INVALID, _failure(run)
    assert run.description["cause"] == ("resume_from still-running: a training job is writing to "
                                        "%s now; wait until it ends or stop its execution" % CHECKPOINTS % "still-running")
    assert run.calls("createTrainingJob") == []
