"""The evaluate stage executed on moto (issue 41.3): after training, before deploy, with the training job's model
artifact as its input and its results in the execution output; a bad evaluate input is refused before any job; a
failed evaluation fails the execution before deploy, naming the trained model it left as it was.
Every request passes botocore's validation and the strict rules of tests/aws_rules.py."""
import json

import pytest
from state_machine.harness import SUCCESS, invalid_sagemaker_requests
from state_machine.test_evaluate_gate import TASK_DATA
from state_machine.test_request import assert_equal_key_by_key

from controlplane import bucket_layout, inputs, prices, request
from lm.spec import contract
from stacks.state_machine import jobs, render, training

DEPLOY = {"enabled": True, "endpoint_name": "gpt", "instance_type": "ml.g4dn.12xlarge"}
EVALUATED = {"BillableTimeInSeconds": 300, "TrainingTimeInSeconds": 320, "FinalMetricDataList": [
    {"MetricName": "evaluation:pile_bpb", "Value": 1.25}, {"MetricName": "evaluation:arc_easy", "Value": 0.5}]}
EVALUATION_SUCCESS = SUCCESS[:-1] + [("Completed", "Completed", EVALUATED)]
EVALUATION_FAILURE = SUCCESS[:3] + [("Failed", "Failed", {"FailureReason": "AlgorithmError: no task arc_easy"})]


def _failure(run):
    return run.description.get("error"), run.description.get("cause"), run.states_entered()[-6:]


def _job_names(run):
    return [parameters["TrainingJobName"] for _, _, parameters in run.calls("createTrainingJob")]


def _input(**evaluate):
    return {"evaluate": dict({"enabled": True, "tasks": ["arc_easy"], "data_s3_uri": TASK_DATA}, **evaluate),
            "deploy": DEPLOY}


@pytest.mark.slow
def test_the_evaluation_runs_after_training_on_its_model_and_its_results_are_in_the_output(deployment):
    deployment.jobs.scripts = [SUCCESS, EVALUATION_SUCCESS]
    run = deployment.run(_input(), name="evaluated")
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, train), (_, _, evaluate) = run.calls("createTrainingJob")
    assert train["TrainingJobName"].startswith("lmstack-train-")
    assert evaluate["TrainingJobName"].startswith("lmstack-eval-")
    channels = {channel["ChannelName"]: channel["DataSource"] for channel in evaluate["InputDataConfig"]}
    model = run.output["model_artifacts"]
    assert channels[contract.MODEL_CHANNEL]["S3DataSource"]["S3Uri"] == model
    assert channels[contract.TASKS_CHANNEL]["S3DataSource"]["S3Uri"] == TASK_DATA
    evaluation = run.output["evaluation"]
    assert evaluation["job_name"] == evaluate["TrainingJobName"] and evaluation["model_artifacts"] == model
    assert evaluation["metrics"] == [{"name": "evaluation:pile_bpb", "value": 1.25},
                                     {"name": "evaluation:arc_easy", "value": 0.5}]
    assert evaluation["results"] == "s3://%s/%s%s/%s/output/output.tar.gz" % (
        deployment.values["ArtifactBucket"], bucket_layout.EVALUATION_PREFIX, "evaluated", evaluate["TrainingJobName"])
    entered = run.states_entered()
    assert entered.index("Evaluate.Start") > entered.index("Train.Succeeded")
    assert entered.index("Deploy") > entered.index("Evaluate.Done")
    assert any("evaluation:arc_easy" in message and model in message for message in deployment.notifications())
    # The bill has the evaluation job: its billable seconds on one instance at the price the gate planned it at.
    (evaluate_line,) = [line for line in run.output["bill"]["jobs"] if line["job"] == "evaluate"]
    planned = run.output["plan"]["prices"]["evaluate"]["usd_per_hour"]
    assert planned == prices.on_demand_price(evaluate["ResourceConfig"]["InstanceType"])
    assert (evaluate_line["name"], evaluate_line["billable_instance_seconds"]) == (evaluate["TrainingJobName"], 300)
    assert evaluate_line["usd"] == pytest.approx(300 * planned / 3600, abs=0.005)
    assert invalid_sagemaker_requests(run) == []
    # The definition sends what the builder builds for this execution's values.
    config = inputs.with_defaults(inputs.schema(deployment.settings), _input())
    values = jobs.concrete_values(jobs.EVALUATE, deployment.settings, config, job_name=evaluate["TrainingJobName"],
                                  execution_name="evaluated", dataset_key=training.concrete_dataset_key(config),
                                  trained=(train["TrainingJobName"], model))
    assert_equal_key_by_key(json.loads(render(request.create_training_job_request(values), deployment.values)),
                            evaluate)


@pytest.mark.slow
def test_without_evaluate_no_evaluation_job_runs(deployment):
    run = deployment.run({}, name="plain")
    assert run.status == "SUCCEEDED", _failure(run)
    assert [name[:13] for name in _job_names(run)] == ["lmstack-train"]
    assert run.output["evaluation"] == {"skipped": "evaluate.enabled is false"}


@pytest.mark.slow
def test_a_failed_evaluation_fails_before_deploy_and_names_the_kept_model(deployment):
    deployment.jobs.scripts = [SUCCESS, EVALUATION_FAILURE]
    run = deployment.run(_input(), name="eval-fails")
    assert run.status == "FAILED"
    assert run.description["error"] == "EvaluateJobFailed"
    cause = run.description["cause"]
    assert "AlgorithmError: no task arc_easy" in cause and "The trained model is kept: s3://" in cause
    assert "model.tar.gz" in cause and "model_artifact" in cause
    assert not run.calls("createModel") and not run.calls("createEndpoint")
    assert invalid_sagemaker_requests(run) == []


@pytest.mark.slow
@pytest.mark.parametrize("evaluate, said", [
    ({"tasks": ["no_such_task_anywhere"]}, "is not one of lm-eval's tasks"),
    ({"data_s3_uri": None}, "need evaluate.data_s3_uri"),
    ({"data_s3_uri": "s3://another-bucket/%sx/" % bucket_layout.TASK_DATA_PREFIX}, "must start with s3://"),
    ({"instance_type": "ml.m5.xlarge", "unknown": 1}, "evaluate has an unknown field"),
], ids=["unknown-task", "no-data", "other-bucket", "unknown-field"])
def test_a_bad_evaluate_input_is_refused_before_any_job(deployment, evaluate, said):
    run = deployment.run(_input(**evaluate), name="bad-eval")
    assert run.status == "FAILED", _failure(run)
    assert said in run.description["cause"], run.description["cause"]
    assert run.calls("createTrainingJob") == []
