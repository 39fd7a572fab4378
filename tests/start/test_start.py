"""`python -m lmstack.start` against moto: a CloudFormation stack whose outputs name a Step
Functions state machine, both created in moto, the machine executed by moto's engine. Service Quotas, which
moto does not answer for SageMaker, is `lmstack.local_service_quotas` with a made-up account's table."""
import io
import json
import re
import time

import pytest
import quota_tables
from family_cases import ASKING, having_message, lacking_cases
from moto import mock_aws

from controlplane import inputs
from lmstack import start
from stacks.settings import Settings

pytestmark = pytest.mark.usefixtures("sdk_retries_at_once")
REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/lmstack-states"
# The stack only has to carry the output; the machine itself is created with the Step
# Functions API (moto executes only machines made that way).
STACK_TEMPLATE = {
    "Parameters": {"Arn": {"Type": "String"}},
    "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
    "Outputs": {"StateMachineArn": {"Value": {"Ref": "Arn"}}, "ArtifactBucket": {"Value": "lmstack-artifacts"}},
}


def _definition(last_state, wait_seconds):
    return json.dumps({"StartAt": "ValidateInput", "States": {
        "ValidateInput": {"Type": "Pass", "Next": "MonitorTraining"},
        "MonitorTraining": {"Type": "Wait", "Seconds": wait_seconds, "Next": last_state["Name"]},
        last_state["Name"]: last_state["State"],
    }})


SUCCEEDS = {"Name": "Done", "State": {"Type": "Pass", "Result": {"model": "s3://bucket/model.tar.gz"}, "End": True}}
FAILS = {"Name": "TrainingFailed", "State": {"Type": "Fail", "Error": "TrainingJobFailed",
                                             "Cause": "CUDA out of memory"}}


def session(region=REGION, quotas=None):
    """A boto3 session under moto whose Service Quotas requests `quotas` answers (default: ample quotas)."""
    return quota_tables.Session(quotas or quota_tables.account(), region)


@pytest.fixture
def aws():
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield session()


def deploy_stack(session, last_state=SUCCEEDS, stack_name="lmstack", outputs=True, wait_seconds=1):
    arn = session.client("stepfunctions").create_state_machine(
        name="%s-training" % stack_name, definition=_definition(last_state, wait_seconds),
        roleArn=ROLE)["stateMachineArn"]
    template = dict(STACK_TEMPLATE)
    if not outputs:
        template["Outputs"] = {"ArtifactBucket": STACK_TEMPLATE["Outputs"]["ArtifactBucket"]}
    session.client("cloudformation").create_stack(
        StackName=stack_name, TemplateBody=json.dumps(template),
        Parameters=[{"ParameterKey": "Arn", "ParameterValue": arn}])
    return arn


@pytest.fixture(autouse=True)
def cdk_json(tmp_path, monkeypatch):
    """The app settings the stack was deployed with (a cdk.json of our own, not the repo's)."""
    path = tmp_path / "cdk.json"
    path.write_text(json.dumps({"app": "python app.py", "context": {"lmstack": {
        "name_prefix": "lmstack", "region": REGION, "runtimes": ["tf211", "tfcurrent"]}}}))
    monkeypatch.setattr(start, "ROOT", str(tmp_path))
    return path


def run(session, argv):
    out = io.StringIO()
    code = start.main(argv, session=session, out=out)
    return code, out.getvalue()


def executions(session, arn):
    return session.client("stepfunctions").list_executions(stateMachineArn=arn)["executions"]


FULL_FLAGS = ["--preset", "gpt-125m", "--strategy", "horovod", "--instance-type", "ml.p3.16xlarge",
              "--instance-count", "2", "--max-runtime", "7200", "--spot", "--dataset", "/datasets/pile",
              "--hp", "max_steps=50", "--hp", "learning_rate=0.0003", "--hp", "xla=false",
              "--hp", "precision=fp16", "--hp", "global_batch_size=128", "--hp", "recompute=true", "--prepare",
              "--deploy", "--endpoint-name", "gpt-small", "--min-quality", "3.5"]


def test_started_execution_carries_the_input_built_from_the_flags(aws):
    arn = deploy_stack(aws)
    code, out = run(aws, FULL_FLAGS + ["--name", "smoke-1"])
    assert code == 0, out
    [execution] = executions(aws, arn)
    assert execution["name"] == "smoke-1"
    described = aws.client("stepfunctions").describe_execution(executionArn=execution["executionArn"])
    sent = json.loads(described["input"])
    assert sent == {
        "preset": "gpt-125m", "strategy": "horovod", "instance_type": "ml.p3.16xlarge", "instance_count": 2,
        "max_runtime_seconds": 7200, "spot": True, "data_directory": "/datasets/pile", "min_quality": 3.5,
        "hyperparameters": {"max_steps": 50, "learning_rate": 0.0003, "xla": False, "precision": "fp16",
                            "global_batch_size": 128, "recompute": True},
        "prepare": {"enabled": True}, "deploy": {"enabled": True, "endpoint_name": "gpt-small"},
    }
    # the gate's plan of the run, printed before the console URL
    plan = start.validate_input(sent, start.load_settings(str(start.ROOT) + "/cdk.json")).plan
    assert start.plan_line(plan) in out
    assert (plan["strategy"], plan["per_device_batch"], plan["steps"]) == ("horovod", 8, 50)
    assert start.console_url(execution["executionArn"]) in out
    assert "region=us-east-1#/v2/executions/details/" + execution["executionArn"] in out


def test_flags_override_a_given_input(aws):
    arn = deploy_stack(aws)
    given = {"preset": "tiny", "strategy": "smddp", "instance_type": "ml.p4d.24xlarge", "instance_count": 4,
             "hyperparameters": {"max_steps": 10}}
    assert run(aws, ["--input", json.dumps(given), "--preset", "gpt-350m", "--hp", "seed=3"])[0] == 0
    [execution] = executions(aws, arn)
    described = aws.client("stepfunctions").describe_execution(executionArn=execution["executionArn"])
    sent = json.loads(described["input"])
    assert sent == dict(given, preset="gpt-350m", hyperparameters={"max_steps": 10, "seed": 3})


def test_the_evaluate_flags_build_the_evaluate_object(capsys):
    out = io.StringIO()
    assert start.main(["--preset", "tiny", "--evaluate", "--eval-tasks", "arc_easy,mine.yaml", "--eval-data",
                       "s3://lmstack-artifacts/tasks/mine/", "--eval-instance-type", "ml.m5.xlarge", "--eval-limit",
                       "100", "--dry-run"], out=out) == 0
    printed, _ = dry_run_output(out.getvalue())
    assert printed["evaluate"] == {
        "enabled": True, "tasks": ["arc_easy", "mine.yaml"], "data_s3_uri": "s3://lmstack-artifacts/tasks/mine/",
        "instance_type": "ml.m5.xlarge", "limit": 100}


def test_the_plan_covers_every_family():
    from controlplane import planner

    plan = start.validate_input({"preset": "rnn-tiny", "hyperparameters": {"model": "rnn"}}, Settings()).plan
    assert plan["hours"] > 0 and json.loads(plan["model_config"])["family"] == "rnn"
    # rnn cannot use smp: the planner reads the family's declaration and says so
    chosen = planner.plan("rnn-tiny", "ml.p3.16xlarge", 1, "smp")["chosen"]
    assert not chosen["ok"] and chosen["reason"].startswith("model rnn cannot use strategy smp (capability smp:")


# One input per capability a family does not declare, for every family of the registry on its smallest
# preset (tests/family_cases.py): lmstack.start refuses each before starting anything, naming the family,
# the capability and the families that declare it (the state machine's Validate stage: tests/state_machine).
@pytest.mark.parametrize("preset,family,capability", lacking_cases(ASKING))
def test_start_refuses_what_the_family_does_not_declare(preset, family, capability):
    make, asked = ASKING[capability]
    execution_input = make(preset, family)
    with pytest.raises(start.StartError) as raised:
        start.validate_input(execution_input, Settings())
    assert str(raised.value).startswith("model %s cannot use %s (capability %s: " % (family, asked, capability))
    assert str(raised.value).endswith("; " + having_message(capability))
    # the same input for gpt passes that check (it declares every capability)
    try:
        start.validate_input(make("tiny", "gpt"), Settings())
    except start.StartError as error:
        assert "capability" not in str(error), error


def test_the_example_input_of_the_state_machine_passes():
    from stacks.state_machine import EXAMPLE_INPUT

    start.validate_input(EXAMPLE_INPUT, Settings())


def test_unset_flags_are_left_to_the_state_machine_defaults(aws):
    arn = deploy_stack(aws)
    assert run(aws, ["--preset", "tiny"])[0] == 0
    [execution] = executions(aws, arn)
    described = aws.client("stepfunctions").describe_execution(executionArn=execution["executionArn"])
    sent = json.loads(described["input"])
    assert sent == {"preset": "tiny"}
    assert execution["name"].startswith("tiny-")
    assert start.EXECUTION_NAME.match(execution["name"])


@pytest.mark.parametrize("flags, named", [
    (["--hp", "nonsense=1"], "hyperparameters.nonsense"),
    (["--hp", "max_steps=0"], "hyperparameters.max_steps must be between 1"),
    (["--hp", "max_steps=2.5"], "hyperparameters.max_steps must be an integer"),
    (["--hp", "xla=maybe"], "hyperparameters.xla must be true or false"),
    (["--hp", "max_steps"], "--hp expects key=value"),
    (["--hp", "preset=tiny"], "hyperparameters.preset"),
    (["--preset", "gpt-9000"], "preset must be one of"),
    (["--preset", "rnn-tiny", "--hp", "model=gpt"], "preset 'rnn-tiny' is not a preset of model gpt"),
    (["--strategy", "zero3"], "strategy must be one of"),
    (["--instance-type", "ml.x1.huge"], "instance_type must be one of"),
    (["--strategy", "smddp", "--instance-type", "ml.g5.2xlarge"], "strategy smddp runs only on instance_type"),
    (["--strategy", "smp", "--instance-type", "ml.p4d.24xlarge"], "needs the tf26 image"),
    (["--strategy", "single", "--instance-count", "2"], "strategy single runs on one instance"),
    (["--instance-count", "0"], "instance_count must be between 1"),
    (["--max-runtime", "0"], "max_runtime_seconds must be between 1"),
    (["--min-quality", "-1"], "min_quality must be at least 0"),
    (["--dataset", "datasets"], "data_directory must start with /"),
    (["--input", '{"deploy": {"enabled": true, "size": 3}}'], "deploy.size"),
    (["--input", '{"prepare": true}'], "prepare must be a JSON object"),
    (["--input", "[1]"], "--input must be a JSON object"),
    (["--input", "{bad"], "--input is not valid JSON"),
    (["--preset", "tiny", "--name", "has spaces"], "--name"),
    (["--preset", "tiny", "--evaluate", "--eval-tasks", "hellaswag"], "need evaluate.data_s3_uri"),
    (["--preset", "tiny", "--evaluate", "--eval-tasks", "helaswag", "--eval-data", "s3://b-b/tasks/x/"],
     "evaluate.tasks entry \"helaswag\" is not one of lm-eval's tasks"),
    # 64 sequences of gpt-125m without recomputation on one A10G, which the planner says do not fit
    (["--hp", "global_batch_size=64", "--hp", "recompute=false"], "lmstack.plan: single on 1 x ml.g5.2xlarge: needs"),
])
def test_invalid_input_names_the_field_and_starts_nothing(aws, capsys, flags, named):
    arn = deploy_stack(aws)
    code, out = run(aws, flags)
    assert code == 2
    assert named in capsys.readouterr().err
    assert executions(aws, arn) == []
    assert "started" not in out


def test_missing_stack_is_a_clear_error(aws, capsys):
    code, _ = run(aws, ["--preset", "tiny", "--stack-name", "nowhere"])
    assert code == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "cdk deploy" in err


def test_stack_without_the_output_lists_what_it_has(aws, capsys):
    deploy_stack(aws, outputs=False)
    code, _ = run(aws, ["--preset", "tiny"])
    assert code == 2
    err = capsys.readouterr().err
    assert "StateMachineArn" in err and "ArtifactBucket" in err


def test_stack_name_and_region_come_from_cdk_json(aws, cdk_json):
    cdk_json.write_text(json.dumps({"context": {"lmstack": {"name_prefix": "team-a", "region": "us-west-2"}}}))
    west = session("us-west-2")
    arn = deploy_stack(west, stack_name="team-a")
    assert run(west, ["--preset", "tiny"])[0] == 0
    assert len(executions(west, arn)) == 1
    settings = start.load_settings(str(cdk_json))
    assert (settings.name_prefix, settings.region) == ("team-a", "us-west-2")


def test_a_bad_cdk_json_is_a_clear_error(aws, cdk_json, capsys):
    cdk_json.write_text(json.dumps({"context": {"lmstack": {"runtimes": ["tf99"]}}}))
    assert run(aws, ["--preset", "tiny"])[0] == 2
    assert "runtimes" in capsys.readouterr().err


def test_dry_run_prints_the_input_and_calls_nothing(capsys):
    class NoAws:
        def client(self, name):
            raise AssertionError("a dry run must not call AWS")

    out = io.StringIO()
    assert start.main(["--preset", "tiny", "--hp", "max_steps=5", "--dry-run"], session=NoAws(), out=out) == 0
    printed, decision = dry_run_output(out.getvalue())
    assert printed == {"preset": "tiny", "hyperparameters": {"max_steps": 5}}
    # and the gate's decision, as the execution would get it: the plan and the notes
    expected = start.validate_input(printed, start.load_settings(str(start.ROOT) + "/cdk.json"))
    assert decision == [start.plan_line(expected.plan)] + ["note: %s" % note for note in expected.notes]
    assert "quotas not checked: this caller does not ask AWS" in decision[-1]


def test_dry_run_plans_with_the_deployments_settings(cdk_json):
    run = ["--preset", "gpt-125m", "--strategy", "horovod", "--instance-type", "ml.p3.16xlarge", "--instance-count",
           "4", "--hp", "global_batch_size=32", "--hp", "recompute=true", "--dry-run", "--cdk-json", str(cdk_json)]
    lines = {}
    for encrypted in (True, False):
        cdk_json.write_text(json.dumps({"context": {"lmstack": {"inter_container_traffic_encryption": encrypted}}}))
        out = io.StringIO()
        assert start.main(run, out=out) == 0
        lines[encrypted] = dry_run_output(out.getvalue())[1][0]
    assert lines[True] != lines[False] and lines[True].startswith("plan: horovod on 4 x ml.p3.16xlarge")


def dry_run_output(text):
    """(the input a dry run printed, the lines after it)."""
    printed, end = json.JSONDecoder().raw_decode(text)
    return printed, text[end:].strip().splitlines()


def test_watch_follows_the_states_until_success(aws):
    deploy_stack(aws, SUCCEEDS)
    code, out = run(aws, ["--preset", "tiny", "--watch", "--poll-seconds", "0.05"])
    assert code == 0, out
    lines = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in
             ("RUNNING", "SUCCEEDED")]
    assert lines[-1][0] == "SUCCEEDED" and lines[-1][1] == "Done"
    # Which states a poll catches depends on timing; whatever it caught comes in definition order.
    order = ["-", "ValidateInput", "MonitorTraining", "Done"]
    seen = [order.index(line[1]) for line in lines]
    assert seen == sorted(seen)
    assert all(line[2] == "elapsed" and line[3].count(":") == 2 for line in lines)
    assert 's3://bucket/model.tar.gz' in out


def test_watch_shows_the_state_the_execution_is_in_and_an_abort(aws):
    arn = deploy_stack(aws, {"Name": "Done", "State": {"Type": "Succeed"}}, wait_seconds=3600)
    stepfunctions = aws.client("stepfunctions")
    execution_arn = stepfunctions.start_execution(stateMachineArn=arn, name="long", input="{}")["executionArn"]
    for _ in range(600):  # moto's engine runs the execution in a thread: wait until it is in the Wait state
        if start.current_state(stepfunctions, execution_arn) == "MonitorTraining":
            break
        time.sleep(0.05)
    stops = []

    def stop_at_the_first_poll(seconds):
        if not stops:
            stops.append(stepfunctions.stop_execution(executionArn=execution_arn, error="Stopped",
                                                      cause="stopped by the test"))
        time.sleep(seconds)

    out = io.StringIO()
    execution = start.watch(stepfunctions, execution_arn, 0.05, out, sleep=stop_at_the_first_poll)
    assert execution["status"] == "ABORTED"
    lines = [line.split()[:2] for line in out.getvalue().splitlines()]
    # moto's engine may still report RUNNING for a poll after the stop; the elapsed time then
    # makes a new line, so compare the sequence of (status, state) changes.
    changes = [line for i, line in enumerate(lines) if i == 0 or line != lines[i - 1]]
    assert changes == [["RUNNING", "MonitorTraining"], ["ABORTED", "MonitorTraining"]]


def test_watch_exits_non_zero_with_the_failure_cause(aws):
    deploy_stack(aws, FAILS)
    code, out = run(aws, ["--preset", "tiny", "--watch", "--poll-seconds", "0.05"])
    assert code == 1
    last = [line for line in out.splitlines() if line.startswith("FAILED ")][-1]
    assert last.split()[1] == "TrainingFailed"
    assert "TrainingJobFailed" in out and "CUDA out of memory" in out


def test_status_line_rewrites_itself_on_a_terminal(aws):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    deploy_stack(aws, SUCCEEDS)
    execution_arn = aws.client("stepfunctions").start_execution(
        stateMachineArn=start.state_machine_arn(aws.client("cloudformation"), "lmstack"), name="tty",
        input="{}")["executionArn"]
    out = Terminal()
    result = start.watch(aws.client("stepfunctions"), execution_arn, 0.05, out)
    assert result["status"] == "SUCCEEDED"
    text = out.getvalue()
    assert "\r" in text and text.endswith("\n") and text.count("\n") == 1


def test_show_request_prints_what_the_run_would_send_and_calls_nothing():
    class NoAws:
        def client(self, name):
            raise AssertionError("--show-request must not call AWS")

    out = io.StringIO()
    assert start.main(["--preset", "gpt-125m", "--strategy", "horovod", "--instance-type", "ml.p3.16xlarge",
                       "--instance-count", "2", "--spot", "--max-runtime", "7200", "--hp", "max_steps=5",
                       "--hp", "recompute=true", "--hp", "global_batch_size=32", "--name", "run-7", "--show-request"],
                      session=NoAws(), out=out) == 0
    sent = json.loads(out.getvalue())
    assert sent["ResourceConfig"]["InstanceType"] == "ml.p3.16xlarge" and sent["ResourceConfig"]["InstanceCount"] == 2
    assert sent["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 14400}
    assert sent["EnableManagedSpotTraining"] is True
    hyperparameters = sent["HyperParameters"]
    assert hyperparameters["max_steps"] == "5" and hyperparameters["strategy"] == '"horovod"'
    assert hyperparameters["sagemaker_mpi_num_of_processes_per_host"] == "8"  # one per V100 of a p3.16xlarge
    assert sent["CheckpointConfig"]["S3Uri"] == "s3://${ArtifactBucket}/checkpoints/run-7/"
    assert sent["RetryStrategy"] == {"MaximumRetryAttempts": 2}
    out = io.StringIO()
    assert start.main(["--preset", "tiny", "--name", "run-8", "--resume-from", "run-7", "--show-request"],
                      session=NoAws(), out=out) == 0
    assert json.loads(out.getvalue())["CheckpointConfig"]["S3Uri"] == "s3://${ArtifactBucket}/checkpoints/run-7/"
    assert sent["AlgorithmSpecification"]["TrainingImage"] == "${Image_tf211}"
    assert sent["ProfilerConfig"] == {"DisableProfiler": True}


# ---- --upload-corpus: a local corpus into the artifact bucket (moto's S3), then prepared in the run ----

def _deploy_with_bucket(session):
    arn = deploy_stack(session, stack_name="lmstack")
    session.client("s3").create_bucket(Bucket="lmstack-artifacts")
    cloudformation = session.client("cloudformation")
    template = dict(STACK_TEMPLATE, Outputs=dict(STACK_TEMPLATE["Outputs"],
                                                  ArtifactBucketName={"Value": "lmstack-artifacts"}))
    cloudformation.update_stack(StackName="lmstack", TemplateBody=json.dumps(template),
                                Parameters=[{"ParameterKey": "Arn", "ParameterValue": arn}])
    return arn


def _corpus(tmp_path):
    from lmstack import sample_corpus
    directory = tmp_path / "pile-sample"
    sample_corpus.write_sample_corpus(str(directory), max_bytes=20000, files=2)
    (directory / "README").write_text("not an input, uploaded all the same")
    return directory


def test_upload_corpus_puts_the_files_under_raw_and_prepares_from_there(aws, tmp_path):
    arn = _deploy_with_bucket(aws)
    corpus = _corpus(tmp_path)
    code, out = run(aws, ["--upload-corpus", str(corpus), "--preset", "tiny"])
    assert code == 0, out
    s3 = aws.client("s3")
    keys = sorted(item["Key"] for item in s3.list_objects_v2(Bucket="lmstack-artifacts")["Contents"])
    assert keys == ["raw/pile-sample/" + name for name in sorted(path.name for path in corpus.iterdir())]
    for path in corpus.iterdir():
        assert s3.get_object(Bucket="lmstack-artifacts", Key="raw/pile-sample/" + path.name)["Body"].read() == \
            path.read_bytes()
    (execution,) = executions(aws, arn)
    sent = json.loads(aws.client("stepfunctions").describe_execution(
        executionArn=execution["executionArn"])["input"])
    assert sent["prepare"] == {"enabled": True, "raw_s3_uri": "s3://lmstack-artifacts/raw/pile-sample/"}
    # Issue 24.4: each corpus its own dataset directory, so a new corpus is not taken for the old dataset.
    assert sent["data_directory"] == "/corpora/pile-sample"

    again_code, again = run(aws, ["--upload-corpus", str(corpus), "--preset", "tiny", "--name", "second"])
    assert again_code == 0 and again.count("already uploaded") == len(keys) and "uploading" not in again


def test_upload_corpus_dry_run_uploads_nothing_and_a_bad_path_starts_nothing(aws, tmp_path, capsys):
    arn = _deploy_with_bucket(aws)
    code, out = run(aws, ["--upload-corpus", str(_corpus(tmp_path)), "--corpus-name", "pile", "--preset", "tiny",
                          "--dry-run"])
    assert code == 0
    assert dry_run_output(out)[0]["prepare"]["raw_s3_uri"] == "s3://<ArtifactBucketName>/raw/pile/"
    assert dry_run_output(out)[0]["data_directory"] == "/corpora/pile"
    code, out = run(aws, ["--upload-corpus", str(tmp_path / "pile-sample"), "--dataset", "/datasets/mine",
                          "--preset", "tiny", "--dry-run"])
    assert code == 0 and dry_run_output(out)[0]["data_directory"] == "/datasets/mine"
    assert "Contents" not in aws.client("s3").list_objects_v2(Bucket="lmstack-artifacts")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    for argv, message in ((["--upload-corpus", str(tmp_path / "missing")], "no such file or directory"),
                          (["--upload-corpus", str(empty)], "holds no .jsonl.zst"),
                          (["--upload-corpus", str(empty), "--corpus-name", "a/b"], "--corpus-name")):
        assert run(aws, argv)[0] == 2
        assert message in capsys.readouterr().err
    assert executions(aws, arn) == []


def test_the_plan_counts_the_deployment_s_traffic_encryption():
    run = {"preset": "gpt-125m", "strategy": "horovod", "instance_type": "ml.p3.16xlarge", "instance_count": 4,
           "hyperparameters": {"global_batch_size": 32, "recompute": True}}
    encrypted = start.validate_input(run, Settings()).plan
    plain = start.validate_input(run, Settings(inter_container_traffic_encryption=False)).plan
    assert Settings().inter_container_traffic_encryption is True
    assert encrypted["cost_on_demand_usd"] > plain["cost_on_demand_usd"]


def test_a_quota_below_the_run_stops_start_before_anything_starts(capsys):
    """lmstack.start asks Service Quotas with the caller's credentials, as the gate's function does."""
    short = "ml.p3.16xlarge for spot training job usage"
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        refused = session(quotas=quota_tables.account({short: 1}))
        arn = deploy_stack(refused)
        code, out = run(refused, FULL_FLAGS)
        assert code == 2 and executions(refused, arn) == [] and "started" not in out
        assert 'the quota "%s" (%s, applied value) is 1' % (short, quota_tables.code(short)) in capsys.readouterr().err
        silent = session(quotas=quota_tables.account(errors={"ListServiceQuotas": ("AccessDeniedException", "no")}))
        code, out = run(silent, FULL_FLAGS)
        assert code == 0 and "note: Service Quotas could not answer (AccessDeniedException: no)" in out
        # its Service Quotas client ends a call within the time the gate's function gives one (aws_clients)
        asked, client = [], refused.client

        def recording(service, **options):
            asked.append((service, options))
            return client(service, **options)

        refused.client = recording
        run(refused, FULL_FLAGS)
        (config,) = [options["config"] for service, options in asked if service == "service-quotas"]
        assert (config.connect_timeout, config.read_timeout) == start.aws_clients.timeouts(start.gate.AWS_CALL_SECONDS)


def test_a_deploy_only_run_starts_with_its_own_plan_line(aws, capsys):
    arn = deploy_stack(aws)
    served = {"preset": "tiny", "deploy": {"enabled": True, "model_artifact":
                                           "s3://lmstack-artifacts/output/job-1/output/model.tar.gz"}}
    code, out = run(aws, ["--input", json.dumps(served)])
    assert code == 0 and len(executions(aws, arn)) == 1
    assert "plan: serve s3://lmstack-artifacts/output/job-1/output/model.tar.gz (preset tiny), no prepare or " \
           "training job" in out
    assert run(aws, ["--input", json.dumps(served), "--show-request"])[0] == 2
    assert "sends no CreateTrainingJob" in capsys.readouterr().err


def test_help_names_only_the_hyperparameters_an_input_may_give(capsys):
    with pytest.raises(SystemExit):
        start.parse_args(["--help"])
    names = re.search(r"names: ([a-z_, \n]+)", capsys.readouterr().out).group(1)
    listed = {name.strip() for name in names.replace("\n", " ").split(",")} - {""}
    assert listed == {spec.name for spec in inputs.input_hyperparameters()}
    assert not {"model_config", "stop_after_seconds", "preset", "strategy"} & listed  # the gate sets these


def test_start_prices_the_run_from_the_price_list_for_the_stack_s_region(capsys):
    """A budget on a type whose price only the AWS Price List has (the table has none for ml.p5e.48xlarge) starts,
    at that price, and says where it came from; without an answer it is refused, naming where it was looked for."""
    from lmstack.local_pricing import PriceList, Product

    run_input = json.dumps({"preset": "gpt-125m", "strategy": "mwms", "instance_type": "ml.p5e.48xlarge",
                            "hyperparameters": {"max_steps": 20}, "budget_usd": 500})
    price_list = PriceList([Product("ml.p5e.48xlarge", "Training", "us-west-2", 70.0)])
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        priced = quota_tables.Session(quota_tables.account(), "us-west-2", price_list=price_list)
        arn = deploy_stack(priced)
        code, out = run(priced, ["--input", run_input])
        assert code == 0, capsys.readouterr().err
        assert "note: price of ml.p5e.48xlarge for training: $70/h (AWS Price List, us-west-2, effective " in out
        assert len(executions(priced, arn)) == 1 and price_list.calls[0]["Filters"][0]["Value"] == "us-west-2"
        code, out = run(session("us-west-2"), ["--input", run_input])
        assert code == 2 and "started" not in out
        assert "ml.p5e.48xlarge has no training price (looked for in the AWS Price List: the AWS Price List could " \
               "not answer (EndpointConnectionError" in capsys.readouterr().err
