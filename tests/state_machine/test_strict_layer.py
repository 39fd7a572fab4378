"""The strict layer of the moto harness (tests/state_machine/harness.py, `StrictLayer`) behaves
as AWS documents, and each of its rules fails a definition that relies on moto's kindness.

- Optional response members (the botocore service model's output shapes: a member not in
  `required` is optional) are stripped unless the scenario reports them.
- `States.ALL` does not catch or retry `States.Runtime` ("Handling errors in Step Functions
  workflows", Step Functions developer guide).
- SageMaker errors of the AWS SDK integration carry their documented names ("AWS SDK service
  integrations", Step Functions developer guide): a Retry on `SageMaker.ThrottlingException` matches.
"""
import copy
import json

import pytest

from state_machine.harness import ROLE, SUCCESS, StrictLayer, required_only

from lmstack import local_sfn
from stacks.state_machine import build_training_definition, render

DEPLOY = {"enabled": True, "endpoint_name": "gpt", "instance_type": "ml.g4dn.12xlarge"}
BROKEN_SELECTOR = {"StartAt": "List", "States": {"List": {
    "Type": "Task", "Resource": "arn:aws:states:::aws-sdk:sagemaker:listTrainingJobs",
    "Parameters": {"MaxResults": 1}, "ResultSelector": {"missing.$": "$.NoSuchField"},
    "Retry": [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 1, "MaxAttempts": 6, "BackoffRate": 2}],
    "End": True}}}


def _failure(run):
    return run.description.get("error"), run.description.get("cause"), run.states_entered()[-6:]


def _shape(operation):
    return local_sfn.SAGEMAKER_MODEL.operation_model(operation).output_shape


def test_required_only_keeps_the_required_members_at_every_depth():
    described = {"EndpointName": "e", "EndpointArn": "arn", "EndpointStatus": "InService", "CreationTime": 1,
                 "LastModifiedTime": 2, "EndpointConfigName": "c", "FailureReason": "x",
                 "ProductionVariants": [{"VariantName": "AllTraffic", "CurrentWeight": 1.0}]}
    assert required_only(_shape("DescribeEndpoint"), described) == {
        "EndpointName": "e", "EndpointArn": "arn", "EndpointStatus": "InService", "CreationTime": 1,
        "LastModifiedTime": 2}
    assert required_only(_shape("DescribeEndpoint"), described, {"EndpointConfigName"})["EndpointConfigName"] == "c"
    job = {"TrainingJobName": "j", "ModelArtifacts": {"S3ModelArtifacts": "s3://b/m"}, "FailureReason": "x",
           "ResourceConfig": {"InstanceType": "ml.p3.2xlarge", "InstanceCount": 1, "VolumeSizeInGB": 50,
                              "VolumeKmsKeyId": "k"}}
    stripped = required_only(_shape("DescribeTrainingJob"), job)
    assert stripped == {"TrainingJobName": "j", "ModelArtifacts": {"S3ModelArtifacts": "s3://b/m"}}
    assert StrictLayer().response("Search", {}, {"Results": []}) == {}
    assert StrictLayer().response("Search", {}, {"Results": [{"TrainingJob": {"TrainingJobName": "j"}}]}) == {
        "Results": [{}]}
    created = StrictLayer()
    created.report("Search", "j", ("TrainingJobName", "Tags"))
    tags = [{"Key": "k", "Value": "v"}]
    assert created.response("Search", {}, {"Results": [{"TrainingJob": {
        "TrainingJobName": "j", "Tags": tags, "FailureReason": "x"}}, {"TrainingJob": {"TrainingJobName": "other"}}]}) \
        == {"Results": [{"TrainingJob": {"TrainingJobName": "j", "Tags": tags}}, {}]}


def test_search_applies_every_filter(deployment):
    """moto's own Search stops at the first Tags.* filter; SageMaker ands them (harness.jobs)."""
    deployment.record_prepared("/datasets/a", "lmstack-prep-a")
    deployment.record_prepared("/datasets/a", "lmstack-prep-elsewhere", file_system_id="fs-0another0000000")

    def names(*filters):
        found = deployment.sagemaker.search(Resource="TrainingJob", SearchExpression={"Filters": list(filters)})
        return sorted(record["TrainingJob"]["TrainingJobName"] for record in found["Results"])

    directory = {"Name": "Tags.lmstack:dataset-directory", "Operator": "Equals", "Value": "/datasets/a"}
    here = {"Name": "Tags.lmstack:file-system", "Operator": "Equals", "Value": deployment.values["FileSystemId"]}
    assert names(directory) == ["lmstack-prep-a", "lmstack-prep-elsewhere"]
    assert names(directory, here) == ["lmstack-prep-a"]


def _run_definition(deployment, definition, name):
    arn = deployment.sfn.create_state_machine(name=name, definition=json.dumps(definition),
                                              roleArn=ROLE)["stateMachineArn"]
    return deployment.run({}, name="%s-run" % name, machine=arn)


def test_states_all_does_not_retry_a_runtime_error(deployment, strict):
    run = _run_definition(deployment, BROKEN_SELECTOR, "broken")
    assert run.status == "FAILED" and run.description["error"] == "States.Runtime"
    assert len(run.calls("listTrainingJobs")) == 1
    assert strict.uncaught == [("List", "States.Runtime")]


def test_moto_alone_retries_the_runtime_error(deployment, strict):
    """Without the layer moto retries the same States.Runtime: what the layer exists to stop."""
    strict.enabled = False
    one_retry = copy.deepcopy(BROKEN_SELECTOR)  # one retry shows it; six would wait 63 s of backoff
    one_retry["States"]["List"]["Retry"][0].update(MaxAttempts=1, BackoffRate=1)
    run = _run_definition(deployment, one_retry, "lenient")
    assert len(run.calls("listTrainingJobs")) == 2


def _reads_endpoint_config_name(states):
    """The deploy stage's poll as it was: DescribeEndpoint's optional EndpointConfigName read directly."""
    states["Deploy.Describe"].update(ResultSelector={"status.$": "$.EndpointStatus",
                                                     "config.$": "$.EndpointConfigName"},
                                     ResultPath="$.deploy_status", Next="Deploy.Check")


def _reads_search_results(states):
    """The prepare stage's skip check as it was: Search's optional Results counted directly."""
    states["Prepare.Search"].update(ResultSelector={"count.$": "States.ArrayLength($.Results)"})


def _reads_failure_reason(states):
    """A failed job's reason read without the defaults merged over it."""
    states["Train.FailureReason"]["Parameters"] = {"reason.$": "$.scratch.FailureReason"}


@pytest.mark.parametrize("break_it, execution_input, script, member", [
    (_reads_endpoint_config_name, {"deploy": DEPLOY}, None, "EndpointConfigName"),
    (_reads_search_results, {"prepare": {"enabled": True}, "data_directory": "/datasets/fresh"}, None, "Results"),
    (_reads_failure_reason, {}, SUCCESS[:2] + [("Failed", "Failed", {})], "FailureReason"),
])
def test_a_state_that_reads_an_optional_member_without_a_default_fails(deployment, break_it, execution_input,
                                                                       script, member):
    definition = copy.deepcopy(build_training_definition(deployment.settings))
    break_it(definition["States"])
    if script:
        deployment.jobs.scripts.append(script)
    arn = deployment.sfn.create_state_machine(name="reads-optional", definition=render(definition, deployment.values),
                                              roleArn=ROLE)["stateMachineArn"]
    run = deployment.run(execution_input, name="reads-optional", machine=arn)
    assert run.status == "FAILED" and run.description["error"] == "States.Runtime", _failure(run)
    assert member in run.description["cause"]


def test_every_path_behaves_without_any_optional_member(deployment):
    """Jobs and endpoints whose describe results carry only the required members."""
    bare = [(status, secondary, {}) for status, secondary, _ in SUCCESS]
    deployment.jobs.scripts.extend([bare, bare])  # the prepare job, then the training job
    done = deployment.run({"deploy": DEPLOY, "prepare": {"enabled": True}, "data_directory": "/datasets/fresh"},
                          name="bare-success")
    assert done.status == "SUCCEEDED", _failure(done)
    assert done.output["billable_seconds"] is None and done.output["final_metrics"] == []
    assert done.output["deploy"]["status"] == "InService"
    assert done.output["prepare"]["job_name"].startswith("lmstack-prep-")  # an empty Search: no Results

    deployment.jobs.scripts.append(SUCCESS[:2] + [("Failed", "Failed", {})])
    failed = deployment.run({}, name="bare-failure")
    assert failed.description["error"] == "TrainJobFailed", _failure(failed)
    assert "no FailureReason given" in failed.description["cause"]

    deployment.jobs.endpoint_script = [("Creating", {}), ("Failed", {})]
    endpoint = deployment.run({"deploy": DEPLOY}, name="bare-endpoint")
    assert endpoint.description["error"] == "DeployFailed", _failure(endpoint)
    assert "no FailureReason given" in endpoint.description["cause"]


def test_an_update_that_rolled_back_fails_when_the_service_reports_the_old_config(deployment):
    deployment.existing_endpoint("lmstack-gpt", "lmstack-old")
    deployment.jobs.endpoint_script = [("Updating", {}), ("InService", {"EndpointConfigName": "lmstack-old"})]
    run = deployment.run({"deploy": DEPLOY}, name="rolled-back")
    assert run.description["error"] == "DeployFailed", _failure(run)
    assert "with config lmstack-old" in run.description["cause"]


def test_final_metrics_without_their_optional_members_are_read_with_defaults(deployment):
    """MetricData's members are all optional in the service model: a metric without a Value is
    reported as null and fails the quality gate rather than the execution."""
    deployment.jobs.scripts.append(SUCCESS[:-1] + [("Completed", "Completed", {
        "FinalMetricDataList": [{"MetricName": "validation:loss"}, {"Value": 3.0}]})])
    run = deployment.run({"deploy": DEPLOY, "min_quality": 3.5}, name="metrics-without-values")
    assert run.status == "SUCCEEDED", _failure(run)
    assert run.output["final_metrics"] == [{"name": "validation:loss", "value": None},
                                           {"name": "unnamed", "value": 3.0}]
    assert "min_quality" in run.output["deploy"]["skipped"]


@pytest.mark.parametrize("enabled, name", [(True, "SageMaker.ThrottlingException"),
                                           (False, "sagemaker.sagemakerException")])
def test_sdk_errors_carry_their_documented_names(deployment, strict, enabled, name):
    """With the layer a throttled create is retried by its documented name; moto alone names it otherwise, so
    the Retry never matches and the create fails."""
    strict.enabled = enabled
    deployment.jobs.create_errors.append(("ThrottlingException", "Rate exceeded"))
    run = deployment.run({}, name="throttled-%s" % enabled)
    creates = run.calls("createTrainingJob")
    if enabled:
        assert run.status == "SUCCEEDED" and len(creates) == 2, _failure(run)
    else:
        assert run.status == "FAILED" and len(creates) == 1
        assert "CreateTrainingJob failed: %s: Rate exceeded" % name in run.description["cause"]
