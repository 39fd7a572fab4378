"""Issue 27 item 4: the capacity options of CreateTrainingJob (SageMaker API reference:
InfraCheckConfig, ResourceConfig.KeepAlivePeriodInSeconds and ResourceConfig.TrainingPlanArn)
as `controlplane.request` builds them pass botocore's own validation and the strict request rules, and
the execution input's `infra_check` reaches the request the machine sends."""

import aws_rules
import botocore.session
import botocore.validate
import pytest

from controlplane import request

PLAN_ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/lmstack-plan"


def _job(**options):
    return request.TrainingJob(
        kind="train", name="lmstack-train-1", image="image", role_arn="arn:aws:iam::123456789012:role/r",
        bucket="bucket", region="us-east-1", hyperparameters={}, instance_type="ml.p5.4xlarge", instance_count=2,
        max_runtime_seconds=3600, spot=False, file_system_id="fs-12345678", security_group_ids=["sg-12345678"],
        subnets=["subnet-12345678"], data_directory="/data", execution_name="run-1", **options)


def _problems(parameters):
    model = botocore.session.get_session().get_service_model("sagemaker")
    report = botocore.validate.ParamValidator().validate(parameters, model.operation_model("CreateTrainingJob")
                                                         .input_shape)
    return ([report.generate_report()] if report.has_errors() else []) + aws_rules.api_constraints(
        "CreateTrainingJob", parameters)


def test_the_options_are_left_out_unless_given():
    built = request.create_training_job_request(_job())
    assert "InfraCheckConfig" not in built
    assert not {"KeepAlivePeriodInSeconds", "TrainingPlanArn"} & set(built["ResourceConfig"])


def test_given_options_pass_botocore_and_the_strict_rules():
    built = request.create_training_job_request(_job(infra_check=True, keep_alive_seconds=1800,
                                                     training_plan_arn=PLAN_ARN))
    assert built["InfraCheckConfig"] == {"EnableInfraCheck": True}
    assert built["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800
    assert built["ResourceConfig"]["TrainingPlanArn"] == PLAN_ARN
    assert _problems(built) == []


@pytest.mark.parametrize("options, field", [
    (dict(keep_alive_seconds=21601), "KeepAlivePeriodInSeconds"),
    (dict(training_plan_arn="arn:aws:sagemaker:us-east-1:123456789012:training-job/x" + "y" * 10), "TrainingPlanArn"),
    (dict(infra_check="yes"), "EnableInfraCheck"),
])
def test_options_outside_the_api_fail(options, field):
    problems = _problems(request.create_training_job_request(_job(**options)))
    assert problems and all(field in problem for problem in problems), problems


def test_the_inputs_reach_the_request(deployment):
    run = deployment.run({"infra_check": True, "keep_alive_seconds": 1800, "training_plan_arn": PLAN_ARN,
                          "hyperparameters": {"max_steps": 5}})
    assert run.status == "SUCCEEDED", run.description
    (call,) = run.calls("createTrainingJob")
    assert call[2]["InfraCheckConfig"] == {"EnableInfraCheck": True}
    assert call[2]["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800
    assert call[2]["ResourceConfig"]["TrainingPlanArn"] == PLAN_ARN
    assert aws_rules.check_requests([call]) == []


def test_without_a_training_plan_the_request_names_none(deployment):
    run = deployment.run({"hyperparameters": {"max_steps": 5}})
    assert run.status == "SUCCEEDED", run.description
    (call,) = run.calls("createTrainingJob")
    assert "TrainingPlanArn" not in call[2]["ResourceConfig"] and aws_rules.check_requests([call]) == []


@pytest.mark.parametrize("execution_input, message", [
    ({"infra_check": "yes"}, "infra_check must be true or false"),
    ({"keep_alive_seconds": 21601}, "keep_alive_seconds must be between 0 and 21600"),
    ({"training_plan_arn": "plan-1"}, "training_plan_arn must start with arn:aws"),
    ({"spot": True, "keep_alive_seconds": 600, "prepare": {"enabled": True, "raw_s3_uri": "s3://bucket/raw/"}},
     "spot true and keep_alive_seconds 600: SageMaker keeps no warm pool of spot instances"),
])
def test_the_validate_stage_refuses_bad_capacity_inputs(deployment, execution_input, message):
    run = deployment.run(execution_input)
    assert run.status == "FAILED" and run.description["error"] == "InvalidInput", run.description
    assert message in run.description["cause"]
    assert deployment.jobs.created == []  # not even the prepare job


