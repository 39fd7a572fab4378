"""The strict request rules (tests/aws_rules.py, a stand-in for what the SageMaker API rejects or requires,
not AWS itself) on the CreateTrainingJob request the training machine really sends on moto: ours passes,
each deliberately wrong copy fails naming the field."""
import copy

import pytest

import aws_rules


@pytest.fixture(scope="module")
def executed_request():
    return {}


def _our_request(deployment, cache):
    if "request" not in cache:
        run = deployment.run({"hyperparameters": {"max_steps": 5}})
        assert run.status == "SUCCEEDED", run.description
        (call,) = run.calls("createTrainingJob")
        cache["request"] = call
    return cache["request"]


def _wrong(call, change):
    resource_type, action, parameters = copy.deepcopy(call)
    change(parameters)
    return [(resource_type, action, parameters)]


@pytest.mark.parametrize("change, field", [
    (lambda p: p.update(TrainingJobName="lmstack-train-" + "0" * 47 + "-10"), "TrainingJobName"),
    (lambda p: p.update(TrainingJobName="lmstack_train_1"), "TrainingJobName"),
    (lambda p: p["HyperParameters"].update(("extra%d" % i, "1") for i in range(100)), "HyperParameters"),
    (lambda p: p["HyperParameters"].update(long_value="x" * 2501), "HyperParameters['long_value']"),
    (lambda p: p.update(ProfilerRuleConfigurations=[{"RuleConfigurationName": "ProfilerReport",
                                                     "RuleEvaluatorImage": "image"}]), "ProfilerRuleConfigurations"),
    (lambda p: p.pop("ProfilerConfig"), "ProfilerConfig.DisableProfiler"),
    (lambda p: p.pop("TensorBoardOutputConfig"), "TensorBoardOutputConfig.S3OutputPath"),
    (lambda p: p.update(RetryStrategy={"MaximumRetryAttempts": 31}), "RetryStrategy.MaximumRetryAttempts"),
    (lambda p: (p.update(EnableManagedSpotTraining=True), p["ResourceConfig"].update(KeepAlivePeriodInSeconds=600)),
     "KeepAlivePeriodInSeconds"),
])
def test_request_rules_fail_on_a_wrong_request_and_pass_on_ours(deployment, executed_request, change, field):
    call = _our_request(deployment, executed_request)
    assert aws_rules.check_requests([call]) == []
    problems = aws_rules.check_requests(_wrong(call, change))
    assert problems and all(field in problem for problem in problems), problems


def test_endpoint_names_follow_the_api_pattern():
    assert aws_rules.api_constraints("CreateEndpoint", {"EndpointName": "lmstack-run-1",
                                                        "EndpointConfigName": "lmstack-run-1-config"}) == []
    (problem,) = aws_rules.api_constraints("CreateEndpoint", {"EndpointName": "lmstack.run_1",
                                                              "EndpointConfigName": "ok"})
    assert "EndpointName" in problem


@pytest.mark.parametrize("resource, field", [
    ({"KeepAlivePeriodInSeconds": 21601}, "KeepAlivePeriodInSeconds"),
    ({"TrainingPlanArn": "arn:aws:sagemaker:us-east-1:123456789012:notebook-instance/" + "x" * 10},
     "TrainingPlanArn"),
])
def test_capacity_options_outside_the_api_limits_fail(deployment, executed_request, resource, field):
    """Issue 27: KeepAlivePeriodInSeconds at most 21600 and TrainingPlanArn's pattern, from botocore's model."""
    call = _our_request(deployment, executed_request)
    problems = aws_rules.check_requests(_wrong(call, lambda p: p["ResourceConfig"].update(resource)))
    assert problems and all(field in problem for problem in problems), problems
