"""The main machine executed on moto: success, job failure, capacity retry, bounded history."""
import json
import re

import pytest

from state_machine.harness import COMPLETED_EXTRA, SUCCESS, StandInSettings, invalid_sagemaker_requests

from controlplane import metrics as log_metrics
from controlplane import history
from controlplane.presets import get_preset
from stacks.settings import Settings
from stacks.state_machine import build_training_definition, jobs


def _failure(run):
    return run.description.get("error"), run.description.get("cause"), run.states_entered()[-5:]


def test_success_path_outputs_and_requests(deployment):
    run = deployment.run({"hyperparameters": {"max_steps": 50}})
    assert run.status == "SUCCEEDED", _failure(run)
    output = run.output
    # The gate's plan of the run, as its handler answered (harness: run from the staged code).
    (answer,) = run.gate_answers()
    assert output["plan"] == answer["plan"]
    assert (output["plan"]["strategy"], output["plan"]["instance_type"], output["plan"]["steps"]) == (
        "single", "ml.g5.2xlarge", 50)
    name = output["job_name"]
    assert name.startswith("lmstack-train-") and name.endswith("-1") and len(name) <= 63
    assert output["model_artifacts"] == "s3://lmstack-artifacts/output/%s/output/model.tar.gz" % name
    assert output["billable_seconds"] == COMPLETED_EXTRA["BillableTimeInSeconds"]
    assert output["console_url"] == (
        "https://us-east-1.console.aws.amazon.com/sagemaker/home?region=us-east-1#/jobs/" + name)
    assert output["final_metrics"] == [{"name": "train:loss", "value": 3.1}, {"name": "validation:loss", "value": 3.3}]
    assert output["attempts"] == 1
    assert output["deploy"] == {"skipped": "deploy.enabled is false"}
    assert output["prepare"] == {"skipped": "prepare.enabled is false"}
    assert invalid_sagemaker_requests(run) == []

    (_, _, request), = run.calls("createTrainingJob")
    hyperparameters = request["HyperParameters"]
    assert hyperparameters["max_steps"] == "50"
    assert hyperparameters["preset"] == '"tiny"'
    # The job is given the preset's configuration (controlplane.presets), as text the toolkit passes on.
    assert json.loads(json.loads(hyperparameters["model_config"])) == get_preset("tiny").to_dict()
    assert hyperparameters["sagemaker_job_name"] == json.dumps(name)
    assert hyperparameters["sagemaker_program"] == '"train.py"'
    assert request["AlgorithmSpecification"]["TrainingImage"].endswith("/lmstack:tfcurrent")
    assert request["AlgorithmSpecification"]["MetricDefinitions"] == log_metrics.METRIC_DEFINITIONS
    assert request["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"] == {
        "FileSystemId": "fs-0123456789abcdef0", "FileSystemAccessMode": "ro", "FileSystemType": "EFS",
        "DirectoryPath": "/datasets/sample"}
    assert request["VpcConfig"] == {"SecurityGroupIds": ["sg-0123456789abcdef0"],
                                    "Subnets": ["subnet-0000000000000000", "subnet-0000000000000001"]}
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600}
    assert request["EnableManagedSpotTraining"] is False
    assert request["EnableInterContainerTrafficEncryption"] is True
    assert request["CheckpointConfig"] == {"S3Uri": "s3://lmstack-artifacts/checkpoints/run-1/",
                                           "LocalPath": "/opt/ml/checkpoints"}
    assert request["ProfilerConfig"] == {"DisableProfiler": True}
    assert "ProfilerRuleConfigurations" not in request and "DebugRuleConfigurations" not in request
    assert request["TensorBoardOutputConfig"] == {"LocalPath": "/opt/ml/output/tensorboard",
                                                  "S3OutputPath": "s3://lmstack-artifacts/tensorboard/run-1"}
    assert {"Key": "lmstack:execution", "Value": "run-1"} in request["Tags"]

    messages = deployment.notifications()
    phases = [message.split(": ")[1] for message in messages  # the monitor's (not the notes', nor the bill)
              if message.startswith("train job ") and "completed" not in message]
    assert phases == ["Starting (InProgress)", "Downloading (InProgress)", "Training (InProgress)",
                      "Uploading (InProgress)"]
    assert any("completed" in message for message in messages)
    assert messages[-1] == "execution run-1: %s" % output["bill"]["text"]  # the end message: the bill


def test_spot_sets_max_wait(deployment):
    run = deployment.run({"spot": True, "max_runtime_seconds": 7200})
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, request), = run.calls("createTrainingJob")
    assert request["EnableManagedSpotTraining"] is True
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 14400}
    assert invalid_sagemaker_requests(run) == []


def test_poll_interval_backs_off_and_restarts_on_phase_change(deployment, waits):
    deployment_jobs = SUCCESS[:3] + [("InProgress", "Training", {})] * 8 + SUCCESS[-1:]
    deployment.jobs.scripts.append(deployment_jobs)
    run = deployment.run({})
    assert run.status == "SUCCEEDED", _failure(run)
    # The first wait, then one after each new phase (Starting, Downloading, Training) at the
    # minimum; then it doubles while the phase stays, up to the gate's cap: 15 minutes for a short run.
    assert waits[:4] == [60, 60, 60, 60]
    assert waits[4:11] == [120, 240, 480, 900, 900, 900, 900]
    assert max(waits) == run.output["plan"]["poll"]["max_seconds"] == history.POLL_MAX_FLOOR == 15 * 60


def test_job_failure_fails_with_reason_and_notifies(deployment):
    reason = "AlgorithmError: loss is NaN at step 1200"
    deployment.jobs.scripts.append(SUCCESS[:3] + [("Failed", "Failed", {"FailureReason": reason})])
    run = deployment.run({})
    assert run.status == "FAILED"
    assert run.description["error"] == "TrainJobFailed"
    assert reason in run.description["cause"]
    assert deployment.jobs.created == [deployment.jobs.created[0]]  # not retried: not a capacity error
    assert any(reason in message for message in deployment.notifications())
    assert invalid_sagemaker_requests(run) == []


def test_stopped_job_fails_with_secondary_status(deployment):
    deployment.jobs.scripts.append(SUCCESS[:3] + [("Stopped", "MaxRuntimeExceeded", {})])
    run = deployment.run({})
    assert run.status == "FAILED"
    assert run.description["error"] == "TrainJobFailed"
    assert "stopped (MaxRuntimeExceeded)" in run.description["cause"]


def test_capacity_error_on_create_is_retried_with_a_new_name(deployment, waits):
    deployment.jobs.create_errors.append(("ResourceLimitExceeded", "Insufficient capacity for ml.g5.2xlarge"))
    run = deployment.run({})
    assert run.status == "SUCCEEDED", _failure(run)
    creates = [request["TrainingJobName"] for _, _, request in run.calls("createTrainingJob")]
    assert len(creates) == 2 and creates[0].endswith("-1") and creates[1].endswith("-2")
    assert deployment.jobs.created == [creates[1]]
    assert run.output["job_name"] == creates[1] and run.output["attempts"] == 2
    assert jobs.CAPACITY_RETRY_SECONDS in waits
    assert invalid_sagemaker_requests(run) == []


# SageMaker's answer when the account's quota for the instance type is too low (0 on a new account for GPU types).
QUOTA_MESSAGE = ("The account-level service limit 'ml.g5.2xlarge for training job usage' is 0 Instances, with current "
                 "utilization of 0 Instances and a request delta of 1 Instances. Please use AWS Service Quotas to "
                 "request an increase for this quota.")


def test_a_quota_fails_at_once_naming_the_quota_to_raise(deployment, waits):
    deployment.jobs.create_errors.append(("ResourceLimitExceeded", QUOTA_MESSAGE))
    run = deployment.run({})
    assert run.status == "FAILED"
    assert run.description["error"] == "TrainJobFailed"
    cause = run.description["cause"]
    assert "account quota, not capacity" in cause and "Service Quotas" in cause
    assert '"ml.g5.2xlarge for training job usage"' in cause and QUOTA_MESSAGE in cause
    assert len(run.calls("createTrainingJob")) == 1 and deployment.jobs.created == []
    assert jobs.CAPACITY_RETRY_SECONDS not in waits
    assert any("Service Quotas" in message for message in deployment.notifications())


def test_a_throttled_create_is_retried_with_backoff_under_the_same_name(deployment, retry_waits):
    deployment.jobs.create_errors += [("ThrottlingException", "Rate exceeded")] * 2
    run = deployment.run({})
    assert run.status == "SUCCEEDED", _failure(run)
    names = [request["TrainingJobName"] for _, _, request in run.calls("createTrainingJob")]
    assert len(names) == 3 and len(set(names)) == 1 and names[0].endswith("-1")
    assert deployment.jobs.created == names[:1] and run.output["attempts"] == 1
    assert len(retry_waits) == 2  # full jitter: each wait is drawn from 0 to the doubling interval
    assert all(0 <= wait <= jobs.THROTTLE_RETRY[0]["IntervalSeconds"] * 2 ** index
               for index, wait in enumerate(retry_waits))


@pytest.mark.slow
def test_capacity_failure_of_the_job_is_retried_then_gives_up(deployment):
    capacity = [("InProgress", "Starting", {}),
                ("Failed", "Failed", {"FailureReason": "CapacityError: Unable to provision requested ML compute capacity"})]
    deployment.jobs.default = capacity
    run = deployment.run({})
    assert run.status == "FAILED"
    assert "CapacityError" in run.description["cause"]
    assert len(deployment.jobs.created) == jobs.MAX_ATTEMPTS
    assert len(set(deployment.jobs.created)) == jobs.MAX_ATTEMPTS


def test_every_create_and_search_retries_throttling():
    """CreateTrainingJob (throttling only: a repeated create of any other error could start a second job)
    and Search (any error: a read) retry with a backoff; the prepare stage's Search had no Retry."""
    definition = build_training_definition(StandInSettings())
    tasks = {name: state for name, state in definition["States"].items()
             if state.get("Resource", "").endswith((":createTrainingJob", ":search"))}
    assert set(tasks) == {"Resume.Search", "Resume.Busy", "Prepare.NotEnabled", "Prepare.Search", "Prepare.Create",
                          "Train.Create", "Train.Create.Drill", "Evaluate.Create"}
    for name, task in tasks.items():
        retried = [set(retry["ErrorEquals"]) for retry in task.get("Retry", []) if retry["BackoffRate"] > 1]
        expected = {jobs.THROTTLED} if ".Create" in name else {"States.ALL"}
        assert expected in retried, (name, task.get("Retry"))


def test_traffic_encryption_is_the_deployment_s_setting():
    for on in (True, False):
        text = json.dumps(build_training_definition(Settings(inter_container_traffic_encryption=on)))
        found = set(re.findall(r'"EnableInterContainerTrafficEncryption": (true|false)', text))
        assert found == {json.dumps(on)}, found
