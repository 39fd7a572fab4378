"""SageMaker managed MLflow (issue 27 item 3): the mlflow_resource_arn setting makes every training
job send MlflowConfig (run named after the job, experiment from the input's mlflow_experiment)
and the Environment `lm.training.tracking` reads, botocore-valid and under the strict request rules, on moto."""
import dataclasses

import pytest
from state_machine.harness import StandInSettings, invalid_sagemaker_requests
from state_machine.test_request import assert_equal_key_by_key, concrete_request

from stacks.settings import MLFLOW_ENDPOINT_SERVICE, Settings, SettingsError
from stacks.state_machine import jobs

ARN = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/lm-experiments"


@pytest.mark.slow
def test_training_jobs_send_mlflow_config_and_the_tracking_environment(make_deployment):
    deployment = make_deployment(dataclasses.replace(StandInSettings(), mlflow_resource_arn=ARN))
    execution_input = {"preset": "tiny", "mlflow_experiment": "gpt-sweeps/lr"}
    run = deployment.run(execution_input, name="mlflow-1")
    assert run.status == "SUCCEEDED", run.description
    (_, _, sent), = run.calls("createTrainingJob")
    assert sent["MlflowConfig"] == {"MlflowResourceArn": ARN, "MlflowExperimentName": "gpt-sweeps/lr",
                                    "MlflowRunName": sent["TrainingJobName"]}
    assert sent["Environment"] == {"MLFLOW_TRACKING_URI": ARN, "MLFLOW_EXPERIMENT_NAME": "gpt-sweeps/lr"}
    assert_equal_key_by_key(concrete_request(deployment, run, jobs.TRAIN, execution_input), sent)
    assert invalid_sagemaker_requests(run) == []
    # moto's DescribeTrainingJob reports no MlflowDetails: the output names no run.
    assert run.output["mlflow_run_id"] is None


@pytest.mark.slow
def test_without_the_setting_no_mlflow_config_is_sent(deployment):
    run = deployment.run({"preset": "tiny"}, name="mlflow-2")
    assert run.status == "SUCCEEDED", run.description
    (_, _, sent), = run.calls("createTrainingJob")
    assert "MlflowConfig" not in sent and "Environment" not in sent
    assert invalid_sagemaker_requests(run) == []


def test_the_setting_takes_a_managed_mlflow_arn_of_the_stack_region():
    reachable = dict(interface_endpoints=(MLFLOW_ENDPOINT_SERVICE,))
    assert Settings(mlflow_resource_arn=ARN, **reachable).mlflow_resource_arn == ARN
    Settings(mlflow_resource_arn="arn:aws:sagemaker:us-east-1:123456789012:mlflow-app/app-abc123", **reachable)
    for wrong in ("arn:aws:sagemaker:eu-west-1:123456789012:mlflow-tracking-server/lm",
                  "arn:aws:sagemaker:us-east-1:123456789012:model/lm", "lm-experiments"):
        with pytest.raises(SettingsError, match="lmstack.mlflow_resource_arn: must be the ARN of a SageMaker "
                                                "managed MLflow tracking server or app in region us-east-1"):
            Settings(mlflow_resource_arn=wrong, **reachable)


def test_a_new_vpc_without_nat_needs_the_mlflow_endpoint_naming_both_settings():
    with pytest.raises(SettingsError, match="lmstack.interface_endpoints: with lmstack.mlflow_resource_arn set, the "
                                            "jobs reach MLflow only through the interface endpoint "
                                            "'sagemaker.experiments'"):
        Settings(mlflow_resource_arn=ARN)
    Settings(mlflow_resource_arn=ARN, nat_gateways=1)  # or through NAT
