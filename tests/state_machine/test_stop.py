"""The stop-on-abort machine stops the aborted execution's running job, and only that one."""
import json
import time

import pytest

from state_machine.harness import StandInSettings, invalid_sagemaker_requests

from stacks.state_machine import build_stop_definition, jobs

RUNNING = [("InProgress", "Starting", {}), ("InProgress", "Training", {})]


def _with_outcome(run, outcome):
    return [job["name"] for job in run.output["jobs"] if job["outcome"] == outcome]


def _status_change_event(deployment, execution_arn, status):
    """The EventBridge "Step Functions Execution Status Change" event the rule forwards."""
    return {"version": "0", "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718",
            "detail-type": "Step Functions Execution Status Change", "source": "aws.states",
            "account": "123456789012", "time": "2026-12-02T18:00:00Z", "region": "us-east-1",
            "resources": [execution_arn],
            "detail": {"executionArn": execution_arn, "stateMachineArn": deployment.machine,
                       "name": execution_arn.split(":")[-1], "status": status,
                       "startDate": 1764698400000, "stopDate": 1764698460000,
                       "input": "{}", "output": None}}


def _wait_for_jobs(deployment, count, timeout=60):
    deadline = time.time() + timeout
    while len(deployment.jobs.created) < count and time.time() < deadline:
        time.sleep(0.1)
    return list(deployment.jobs.created)


def test_abort_stops_that_executions_job_only(deployment):
    deployment.jobs.default = RUNNING
    aborted = deployment.start({}, name="to-abort")
    first = _wait_for_jobs(deployment, 1)
    kept = deployment.start({}, name="to-keep")
    created = _wait_for_jobs(deployment, 2)
    assert len(created) == 2
    arrived, release = deployment.jobs.park(first[0])
    assert arrived.wait(60)
    deployment.sfn.stop_execution(executionArn=aborted, error="UserAbort", cause="test")
    release.set()
    ended = deployment.wait(aborted)
    assert ended["status"] == "ABORTED", (ended.get("error"), ended.get("cause"))

    run = deployment.run(_status_change_event(deployment, aborted, "ABORTED"), name="stop-1",
                         machine=deployment.stop_machine)
    assert run.status == "SUCCEEDED", (run.description.get("cause"), run.states_entered())
    assert _with_outcome(run, "stopped") == first
    assert deployment.jobs.stopped == first
    statuses = {name: deployment.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"]
                for name in created}
    assert statuses[first[0]] == "Stopped"
    assert statuses[[name for name in created if name != first[0]][0]] == "InProgress"
    assert invalid_sagemaker_requests(run) == []
    assert any("to-abort" in message and "ABORTED" in message for message in deployment.notifications())
    deployment.sfn.stop_execution(executionArn=kept)


def test_nothing_to_stop_is_fine(deployment):
    run = deployment.run(_status_change_event(
        deployment, "arn:aws:states:us-east-1:123456789012:execution:lmstack-training:gone", "TIMED_OUT"),
        name="stop-2", machine=deployment.stop_machine)
    assert run.status == "SUCCEEDED", run.description.get("cause")
    assert run.output["jobs"] == []
    assert json.loads(run.description["input"])["detail"]["status"] == "TIMED_OUT"


def _aborted_with_running_job(deployment, name):
    """An execution aborted while its job runs; returns (execution ARN, the job's name)."""
    deployment.jobs.default = RUNNING
    execution = deployment.start({}, name=name)
    (job,) = _wait_for_jobs(deployment, 1)
    arrived, release = deployment.jobs.park(job)
    assert arrived.wait(60)
    deployment.sfn.stop_execution(executionArn=execution, error="UserAbort", cause="test")
    release.set()
    assert deployment.wait(execution)["status"] == "ABORTED"
    return execution, job


def test_a_throttled_stop_is_retried(deployment, retry_waits):
    execution, job = _aborted_with_running_job(deployment, "throttled")
    deployment.jobs.stop_errors += [("ThrottlingException", "Rate exceeded")] * 2
    run = deployment.run(_status_change_event(deployment, execution, "ABORTED"), name="stop-throttled",
                         machine=deployment.stop_machine)
    assert run.status == "SUCCEEDED", (run.description.get("cause"), run.states_entered())
    assert _with_outcome(run, "stopped") == [job] and deployment.jobs.stopped == [job]
    assert len(run.calls("stopTrainingJob")) == 3 and len(retry_waits) == 2


def test_a_job_that_ended_meanwhile_needs_no_stop(deployment):
    """Listed in progress, completed before its StopTrainingJob: SageMaker's answer then."""
    execution, job = _aborted_with_running_job(deployment, "ended")
    deployment.jobs.stop_errors.append(
        ("ValidationException", "The request was rejected because the training job is in status Completed."))
    run = deployment.run(_status_change_event(deployment, execution, "ABORTED"), name="stop-ended",
                         machine=deployment.stop_machine)
    assert run.status == "SUCCEEDED", (run.description.get("cause"), run.states_entered())
    assert run.output["jobs"] == [{"name": job, "outcome": "ended"}]


def test_a_stop_that_keeps_failing_fails_the_execution_naming_the_job(deployment):
    execution, job = _aborted_with_running_job(deployment, "refused")
    refusal = "User is not authorized to perform: sagemaker:StopTrainingJob"
    deployment.jobs.stop_errors.append(("AccessDeniedException", refusal))
    run = deployment.run(_status_change_event(deployment, execution, "ABORTED"), name="stop-refused",
                         machine=deployment.stop_machine)
    assert run.status == "FAILED"
    assert run.description["error"] == "StopTrainingJobFailed"
    assert job in run.description["cause"] and refusal in run.description["cause"]
    assert deployment.jobs.stopped == []
    assert any("COULD NOT STOP" in message and job in message for message in deployment.notifications())


@pytest.mark.parametrize("state", ["List", "StopJob"])
def test_a_throttled_call_is_retried(state):
    """ListTrainingJobs and StopTrainingJob retry throttling (with a backoff)."""
    definition = build_stop_definition(StandInSettings())
    task = definition["States"][state] if state in definition["States"] else \
        definition["States"]["Stop"]["ItemProcessor"]["States"][state]
    assert any(set(retry["ErrorEquals"]) & {"States.ALL", jobs.THROTTLED} and retry["BackoffRate"] > 1
               for retry in task["Retry"])
