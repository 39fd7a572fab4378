"""Prepare and deploy stages, executed on moto (issue 5)."""
import json

import boto3
import botocore.session
import botocore.validate
import pytest
from state_machine.harness import invalid_sagemaker_requests

from lmstack.local_sfn import REGION

from stacks.state_machine import EXAMPLE_INPUT

# moto accepts only its own (older) list of hosting instance types: no ml.g5.*.
DEPLOY = {"enabled": True, "endpoint_name": "gpt", "instance_type": "ml.g4dn.12xlarge"}


def _failure(run):
    return run.description.get("error"), run.description.get("cause"), run.states_entered()[-6:]


def _actions(run):
    return [action for _, action, _ in run.calls() if action != "publish"]


@pytest.mark.slow
def test_prepare_runs_then_is_skipped_for_the_same_dataset_then_forced(make_deployment):
    deployment = make_deployment(prepared=())
    prepare = {"enabled": True, "raw_directory": "/raw/pile", "hyperparameters": {"seq_len": 1024, "workers": 8}}
    deployment.file_system.make("/raw/pile")  # raw files someone copied onto the file system
    first = deployment.run({"prepare": prepare}, name="prep-1")
    assert first.status == "SUCCEEDED", _failure(first)
    (_, _, request), _ = first.calls("createTrainingJob")
    assert request["TrainingJobName"].startswith("lmstack-prep-")
    assert request["HyperParameters"]["sagemaker_program"] == '"prepare.py"'
    assert request["HyperParameters"]["seq_len"] == "1024"
    assert "model_dir" not in request["HyperParameters"]
    channels = {channel["ChannelName"]: channel["DataSource"]["FileSystemDataSource"]
                for channel in request["InputDataConfig"]}
    assert channels["raw"]["DirectoryPath"] == "/raw/pile" and channels["raw"]["FileSystemAccessMode"] == "ro"
    # The root, the one directory a fresh file system has; lm.data.prepare makes the dataset directory in it.
    assert channels["dataset"]["DirectoryPath"] == "/"
    assert channels["dataset"]["FileSystemAccessMode"] == "rw"
    assert json.loads(request["HyperParameters"]["dataset_directory"]) == "/datasets/sample"
    assert json.loads(request["HyperParameters"]["raw_sharded"]) is False
    assert first.output["prepare"]["job_name"] == request["TrainingJobName"]
    assert invalid_sagemaker_requests(first) == []

    again = deployment.run({"prepare": prepare}, name="prep-2")
    assert again.status == "SUCCEEDED", _failure(again)
    assert [request["TrainingJobName"][:13] for _, _, request in again.calls("createTrainingJob")] == ["lmstack-train"]
    assert "already completed" in again.output["prepare"]["skipped"]
    assert invalid_sagemaker_requests(again) == []

    faster = deployment.run({"prepare": dict(prepare, hyperparameters={"seq_len": 1024, "workers": 2})},
                            name="prep-3")  # workers change how fast, not what: the same dataset
    assert "already completed" in faster.output["prepare"]["skipped"]
    forced = deployment.run({"prepare": dict(prepare, force=True)}, name="prep-4")
    assert forced.status == "SUCCEEDED", _failure(forced)
    assert forced.calls("createTrainingJob")[0][2]["TrainingJobName"].startswith("lmstack-prep-")


@pytest.mark.slow
@pytest.mark.parametrize("change", [
    {"raw_s3_uri": "s3://lmstack-artifacts/raw/new-corpus/"}, {"raw_directory": "/raw/other"},
    {"hyperparameters": {"seq_len": 1024}}, {"hyperparameters": {"val_fraction": 0.01}},
    {"hyperparameters": {"eod_token": "<eod>"}}, {"hyperparameters": {"shard_size": 1 << 20}},
    {"hyperparameters": {"vocab_size": 32000}}, {"force": True, "raw_s3_uri": "s3://lmstack-artifacts/raw/new-corpus/"},
], ids=["s3-corpus", "efs-corpus", "seq_len", "val_fraction", "eod_token", "shard_size", "vocab_size", "forced"])
def test_another_dataset_into_a_prepared_directory_is_refused_naming_both_sources(make_deployment, change):
    """Issue 24.4: a new corpus (or settings that change the shards) into a directory that holds a
    dataset was skipped (the key had no raw source) or, forced, mixed into the old manifest."""
    deployment = make_deployment(prepared=())
    deployment.file_system.make("/raw/pile")
    prepare = {"enabled": True, "raw_directory": "/raw/pile"}
    assert deployment.run({"prepare": prepare}, name="first").status == "SUCCEEDED"
    hyperparameters = dict(prepare.get("hyperparameters", {}), **change.pop("hyperparameters", {}))
    refused = deployment.run({"prepare": dict(prepare, hyperparameters=hyperparameters, **change)}, name="second")
    assert refused.status == "FAILED" and refused.description["error"] == "DirectoryHoldsAnotherDataset"
    cause = refused.description["cause"]
    new_source = change.get("raw_s3_uri", change.get("raw_directory", "/raw/pile"))
    assert "/datasets/sample" in cause and "made from /raw/pile;" in cause and "prepare %s into it" % new_source in cause
    assert refused.calls("createTrainingJob") == []


@pytest.mark.slow
def test_the_dataset_checks_count_only_this_stacks_file_system(make_deployment):
    """A prepare job of another stack (another file system) neither prepares this one's directory nor
    holds it: the training run is refused, the prepare stage runs."""
    deployment = make_deployment(prepared=())
    deployment.record_prepared("/datasets/sample", "lmstack-prep-other-stack", file_system_id="fs-0another0000000")
    unprepared = deployment.run({}, name="other-stack-only")
    assert unprepared.status == "FAILED" and unprepared.description["error"] == "DatasetNotPrepared"
    prepared = deployment.run({"prepare": {"enabled": True, "raw_s3_uri": "s3://lmstack-artifacts/raw/x/"}},
                              name="prepares-here")
    assert prepared.status == "SUCCEEDED", _failure(prepared)
    assert prepared.calls("createTrainingJob")[0][2]["TrainingJobName"].startswith("lmstack-prep-")


@pytest.mark.slow
def test_deploy_creates_model_config_endpoint_and_waits(deployment, waits):
    run = deployment.run({"deploy": DEPLOY, "min_quality": 3.5})
    assert run.status == "SUCCEEDED", _failure(run)
    actions = _actions(run)
    deploy = actions[actions.index("createModel"):]
    assert deploy == ["createModel", "createEndpointConfig", "describeEndpoint", "createEndpoint",
                      "describeEndpoint", "describeEndpoint", "putMetricAlarm"]
    (_, _, model), = run.calls("createModel")
    assert model["PrimaryContainer"]["ModelDataUrl"] == run.output["model_artifacts"]
    assert model["PrimaryContainer"]["Image"].endswith("/lmstack:tfcurrent")
    # Its own role and security group, not the jobs' (which may write checkpoints and mount the file system).
    assert model["ExecutionRoleArn"] == deployment.values["EndpointRoleArn"] != deployment.values["ExecutionRoleArn"]
    assert model["VpcConfig"]["SecurityGroupIds"] == [deployment.values["HostingSecurityGroupId"]]
    (_, _, config), = run.calls("createEndpointConfig")
    assert config["ProductionVariants"][0]["InstanceType"] == "ml.g4dn.12xlarge"
    assert "DataCaptureConfig" not in config
    endpoint = deployment.sagemaker.describe_endpoint(EndpointName="lmstack-gpt")
    assert endpoint["EndpointConfigName"] == config["EndpointConfigName"]
    assert run.output["deploy"]["endpoint_name"] == "lmstack-gpt"
    assert run.output["deploy"]["status"] == "InService"
    # the deploy note says what the endpoint bills (the plan's endpoint; the function's SDK reaches no Price
    # List here and the table has no hosting prices)
    assert "endpoint lmstack-gpt is InService with model %s: 1 x ml.g4dn.12xlarge bills every hour until deleted " \
           "(no price (controlplane.prices, us-east-1))" % model["ModelName"] in deployment.notifications()
    assert 60 in waits[-2:]
    assert invalid_sagemaker_requests(run) == []


@pytest.mark.slow
def test_a_deployed_endpoint_gets_an_alarm_when_nobody_calls_it(deployment):
    run = deployment.run({"deploy": DEPLOY})
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, request), = run.calls("putMetricAlarm")
    model = botocore.session.get_session().get_service_model("cloudwatch")
    report = botocore.validate.ParamValidator().validate(request, model.operation_model("PutMetricAlarm").input_shape)
    assert not report.has_errors(), report.generate_report()
    # CloudWatch evaluates at most a day of data for an alarm (Period x EvaluationPeriods).
    assert request["Period"] * request["EvaluationPeriods"] <= 24 * 3600
    (alarm,) = boto3.client("cloudwatch", region_name=REGION).describe_alarms(
        AlarmNamePrefix="lmstack-gpt")["MetricAlarms"]
    assert alarm["AlarmName"] == "lmstack-gpt-no-invocations"
    assert (alarm["Namespace"], alarm["MetricName"], alarm["Statistic"]) == ("AWS/SageMaker", "Invocations", "Sum")
    assert {d["Name"]: d["Value"] for d in alarm["Dimensions"]} == {"EndpointName": "lmstack-gpt",
                                                                    "VariantName": "AllTraffic"}
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 1)
    assert alarm["TreatMissingData"] == "breaching"  # no traffic reports no data
    assert alarm["AlarmActions"] == [deployment.topic]
    assert "aws sagemaker delete-endpoint --endpoint-name lmstack-gpt" in alarm["AlarmDescription"]


@pytest.mark.slow
def test_min_quality_gates_deploy_off(deployment):
    run = deployment.run({"deploy": DEPLOY, "min_quality": 3.0})
    assert run.status == "SUCCEEDED", _failure(run)
    assert "min_quality" in run.output["deploy"]["skipped"]
    assert run.calls("createModel") == []
    assert any("not deployed" in message for message in deployment.notifications())


@pytest.mark.slow
def test_endpoint_failure_fails_and_notifies(deployment):
    reason = "The primary container for production variant AllTraffic did not pass the ping health check."
    deployment.jobs.endpoint_script = [("Creating", {}), ("Failed", {"FailureReason": reason})]
    run = deployment.run({"deploy": DEPLOY})
    assert run.status == "FAILED"
    assert run.description["error"] == "DeployFailed"
    assert reason in run.description["cause"]
    assert any(reason in message for message in deployment.notifications())
    assert invalid_sagemaker_requests(run) == []


@pytest.mark.slow
def test_existing_endpoint_is_updated_not_duplicated(deployment):
    sagemaker = deployment.sagemaker
    deployment.existing_endpoint("lmstack-gpt", "lmstack-old")
    deployment.jobs.endpoint_script = [("InService", {})]
    sagemaker.describe_endpoint(EndpointName="lmstack-gpt")
    deployment.jobs.endpoint_script = [("Updating", {}), ("InService", {})]
    run = deployment.run({"deploy": DEPLOY})
    assert run.status == "SUCCEEDED", _failure(run)
    assert run.calls("createEndpoint") == []
    (_, _, update), = run.calls("updateEndpoint")
    assert sagemaker.describe_endpoint(EndpointName="lmstack-gpt")["EndpointConfigName"] == update["EndpointConfigName"]
    assert [endpoint["EndpointName"] for endpoint in sagemaker.list_endpoints()["Endpoints"]] == ["lmstack-gpt"]
    assert invalid_sagemaker_requests(run) == []


@pytest.mark.slow
def test_example_input_runs_the_whole_lifecycle(deployment):
    example = json.loads(json.dumps(EXAMPLE_INPUT))
    example["deploy"]["instance_type"] = DEPLOY["instance_type"]
    run = deployment.run(example)
    assert run.status == "SUCCEEDED", _failure(run)
    assert run.output["deploy"]["status"] == "InService"
    assert invalid_sagemaker_requests(run) == []


def _channels(request):
    return {channel["ChannelName"]: channel for channel in request["InputDataConfig"]}


@pytest.mark.slow
def test_a_fresh_account_prepares_from_s3_then_trains_on_the_dataset_read_only(make_deployment):
    deployment = make_deployment(prepared=())
    assert deployment.file_system.directories == {"/"}
    raw = "s3://lmstack-artifacts/raw/pile/"
    run = deployment.run({"prepare": {"enabled": True, "raw_s3_uri": raw, "instance_count": 3,
                                      "hyperparameters": {"tokenizer": "/tokenizers/gpt2.json"}}}, name="fresh-1")
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, prepare), (_, _, train) = run.calls("createTrainingJob")
    raw_channel = _channels(prepare)["raw"]
    assert raw_channel["InputMode"] == "FastFile"
    assert raw_channel["DataSource"]["S3DataSource"] == {
        "S3DataType": "S3Prefix", "S3Uri": raw, "S3DataDistributionType": "ShardedByS3Key"}
    assert json.loads(prepare["HyperParameters"]["raw_sharded"]) is True
    assert _channels(prepare)["dataset"]["DataSource"]["FileSystemDataSource"]["DirectoryPath"] == "/"
    train_channel = _channels(train)["train"]["DataSource"]["FileSystemDataSource"]
    assert train_channel["DirectoryPath"] == "/datasets/sample" and train_channel["FileSystemAccessMode"] == "ro"
    assert invalid_sagemaker_requests(run) == []  # the prepare job made the directory the training job mounts
    assert "/datasets/sample" in deployment.file_system.directories

    again = deployment.run({}, name="fresh-2")  # no prepare stage: the completed prepare job is found
    assert again.status == "SUCCEEDED", _failure(again)
    assert [request["TrainingJobName"][:13] for _, _, request in again.calls("createTrainingJob")] == ["lmstack-train"]
    assert invalid_sagemaker_requests(again) == []


@pytest.mark.slow
def test_training_on_a_dataset_never_prepared_is_refused_before_any_job(make_deployment):
    deployment = make_deployment(prepared=())
    run = deployment.run({"data_directory": "/datasets/pile"}, name="unprepared")
    assert run.status == "FAILED"
    assert run.description["error"] == "DatasetNotPrepared"
    cause = run.description["cause"]
    assert "/datasets/pile" in cause and "prepare.enabled" in cause and "prepare.raw_s3_uri" in cause
    assert run.calls("createTrainingJob") == []
    # Another directory's prepare job does not count.
    deployment.record_prepared("/datasets/other", "lmstack-prep-other")
    assert deployment.run({"data_directory": "/datasets/pile"}, name="unprepared-2").status == "FAILED"
    deployment.record_prepared("/datasets/pile", "lmstack-prep-pile")
    assert deployment.run({"data_directory": "/datasets/pile"}, name="prepared").status == "SUCCEEDED"


@pytest.mark.slow
def test_a_failed_prepare_job_does_not_count_as_prepared(make_deployment):
    from state_machine.harness import SUCCESS
    deployment = make_deployment(prepared=())
    deployment.jobs.scripts = [[("InProgress", "Starting", {}), ("Failed", "Failed", {"FailureReason": "bad input"})]]
    failed = deployment.run({"prepare": {"enabled": True, "raw_s3_uri": "s3://lmstack-artifacts/raw/x/"}},
                            name="prep-fails")
    assert failed.status == "FAILED" and failed.description["error"] == "PrepareJobFailed"
    deployment.jobs.default = SUCCESS
    later = deployment.run({}, name="after-failed-prepare")
    assert later.status == "FAILED" and later.description["error"] == "DatasetNotPrepared"


@pytest.mark.slow
def test_a_raw_prefix_the_jobs_cannot_read_is_refused_before_any_job(make_deployment):
    from state_machine.harness import StandInSettings
    deployment = make_deployment(StandInSettings(raw_data_prefixes=("s3://my-corpora/pile/",)), prepared=())
    refused = deployment.run({"prepare": {"enabled": True, "raw_s3_uri": "s3://someone-else/pile/"}}, name="outside")
    assert refused.status == "FAILED" and refused.description["error"] == "InvalidInput"
    cause = refused.description["cause"]
    assert "prepare.raw_s3_uri" in cause and "s3://someone-else/pile/" in cause
    assert "s3://lmstack-artifacts/raw/" in cause and "s3://my-corpora/pile/" in cause and "raw_data_prefixes" in cause
    assert refused.calls("createTrainingJob") == []
    allowed = deployment.run({"prepare": {"enabled": True, "raw_s3_uri": "s3://my-corpora/pile/train/"}},
                             name="configured")
    assert allowed.status == "SUCCEEDED", _failure(allowed)
    assert invalid_sagemaker_requests(allowed) == []
