"""A SageMaker training job as states: name, request, create, monitor loop, outcome.

Used twice by the main machine: the "prepare" job (lm.prepare) and the training job.

- Name per attempt: `<prefix>-<token>-<md5 of the execution ARN>-<attempt>` ([a-z0-9-],
  <= 57 chars with a 16-char prefix); the stop machine finds an execution's jobs by the hash.
- CreateTrainingJob runs through the AWS SDK integration (`aws-sdk:sagemaker:createTrainingJob`,
  request-response) rather than the optimized `sagemaker:createTrainingJob`: moto executes the
  optimized one only by forwarding and turns its errors into an uncatchable States.Runtime, so
  its error path could not be tested. Errors are caught whole; a capacity error is recognized
  by its text (the create error or the job's FailureReason, CAPACITY_PATTERNS) and retried
  with a fresh name after a doubling wait, at most MAX_ATTEMPTS attempts in all.
- Monitor: Wait -> DescribeTrainingJob -> Choice. The wait starts at POLL_MIN_SECONDS, doubles
  while nothing changes up to POLL_MAX_SECONDS and starts over on each SecondaryStatus change
  (notified to SNS). A steady iteration writes 9 history events, so a 30-day job writes about
  30 * 86400 / 3840 * 9 = 6,075 events, a quarter of the 25,000 limit.
"""
import collections
import json

from lm import job
from stacks.state_machine import asl
from stacks.state_machine.inputs import TOP_LEVEL_HYPERPARAMETERS
from stacks.state_machine.names import image_placeholder, subnet_placeholder

POLL_MIN_SECONDS = 60
POLL_MAX_SECONDS = 3840  # POLL_MIN_SECONDS * 2**6
MAX_ATTEMPTS = 4
CAPACITY_RETRY_SECONDS = 120
CAPACITY_PATTERNS = ("*ResourceLimitExceeded*", "*CapacityError*", "*InsufficientInstanceCapacity*",
                     "*insufficient capacity*")
VOLUME_SIZE_GB = 100
PROFILING_INTERVAL_MS = 500
PROFILER_RULES = ("LowGPUUtilization", "IOBottleneck")
TAG_PREFIX = "lmstack:"
DATASET_KEY_TAG = TAG_PREFIX + "dataset-key"
RETRY = [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 10, "MaxAttempts": 6, "BackoffRate": 2}]
# Defaults for the optional fields of describe results (kept in $.run.defaults: intrinsics
# take no object literals).
DESCRIBE_DEFAULTS = {
    "failed_job": {"FailureReason": "no FailureReason given"},
    "completed_job": {"BillableTimeInSeconds": None, "TrainingTimeInSeconds": None, "FinalMetricDataList": []},
    "failed_endpoint": {"FailureReason": "no FailureReason given"},
}

# Stand-ins for values only the execution knows; `template_values` turns each into a path.
_JOB_NAME = "<<job-name>>"
_OUTPUT_PATH = "<<output-path>>"
_INSTANCE_TYPE = "<<instance-type>>"
_PROCESSES = 987654321
_MP_PARAMETERS = {"<<mp-parameters>>": True}


def artifact_uri(prefix):
    return "s3://${ArtifactBucket}/%s" % prefix


class JobKind(collections.namedtuple("JobKind", "state token slot kind config spot_path")):
    """state: state-name prefix; token: in the job name; slot: where its state lives;
    kind: lm.job.JOB_KINDS key; config: its settings in $.config; spot_path: or None."""


TRAIN = JobKind("Train", "train", "$.train", "train", "$.config", "$.config.spot")
PREPARE = JobKind("Prepare", "prep", "$.prepare", "prepare", "$.config.prepare", None)


def hyperparameter_template(values, *, strategy, kind, settings, slot):
    """The HyperParameters map as Parameters: `lm.job.sdk_hyperparameters` evaluated on stand-ins.

    `values`: hyperparameter name -> the JSONPath of its value. Every stand-in in the SDK's
    encoded map becomes `States.JsonToString(<path>)`; everything else stays a literal.
    """
    stand_ins = collections.OrderedDict(("<<hp:%s>>" % name, path) for name, path in values.items())
    stand_ins[_INSTANCE_TYPE] = "$.config.instance_type"
    stand_ins[_JOB_NAME] = slot + ".name"
    encoded = job.sdk_hyperparameters(
        collections.OrderedDict((name, "<<hp:%s>>" % name) for name in values),
        strategy=strategy, instance_type=_INSTANCE_TYPE, gpus_per_host=_PROCESSES, job_name=_JOB_NAME,
        region=settings.region, output_path=_OUTPUT_PATH, job_kind=kind, mp_parameters=_MP_PARAMETERS)
    template = collections.OrderedDict()
    for key, raw in encoded.items():
        value = job.decode_hyperparameter(raw)
        if isinstance(value, str) and value in stand_ins:
            template[key + ".$"] = asl.to_json(stand_ins[value])
        elif value == _PROCESSES and not isinstance(value, bool):
            template[key + ".$"] = asl.to_json("$.hosts.processes_per_host")
        elif value == _MP_PARAMETERS:
            template[key + ".$"] = asl.to_json("$.config.mp_parameters")
        elif isinstance(value, str) and _JOB_NAME in value:
            text = value.replace(_OUTPUT_PATH, artifact_uri("output").rstrip("/"))
            template[key + ".$"] = asl.to_json(asl.fmt(text.replace(_JOB_NAME, "{}"), slot + ".name"))
        else:
            template[key] = raw
    leftovers = [key for key, value in template.items() if "<<" in json.dumps(value)]
    if leftovers:
        raise AssertionError("stand-ins left in hyperparameters %s" % leftovers)
    return template


def train_hyperparameters(strategy, settings):
    values = collections.OrderedDict(
        (name, "$.config.%s" % name if name in TOP_LEVEL_HYPERPARAMETERS else "$.config.hyperparameters.%s" % name)
        for name in job.HYPERPARAMETERS)
    return hyperparameter_template(values, strategy=strategy, kind="train", settings=settings, slot=TRAIN.slot)


def prepare_hyperparameters(settings):
    values = collections.OrderedDict(
        (name, "$.config.prepare.hyperparameters.%s" % name) for name in job.PREPARE_HYPERPARAMETERS)
    return hyperparameter_template(values, strategy="single", kind="prepare", settings=settings, slot=PREPARE.slot)


def _channel(name, directory_path, access_mode):
    channel = job.efs_channel(name, "${FileSystemId}", None, access_mode)
    source = channel["DataSource"]["FileSystemDataSource"]
    del source["DirectoryPath"]
    source["DirectoryPath.$"] = directory_path
    return channel


def vpc_config(settings):
    return {"SecurityGroupIds": ["${SecurityGroupId}"],
            "Subnets": ["${%s}" % subnet_placeholder(index) for index in range(settings.az_count)]}


def tags(kind, extra=()):
    return [{"Key": TAG_PREFIX + "execution", "Value.$": "$$.Execution.Name"},
            {"Key": TAG_PREFIX + "kind", "Value": kind}] + list(extra)


def create_request(kind, settings):
    """CreateTrainingJob parameters; hyperparameters and image were put in <slot>.request."""
    slot = kind.slot
    request = collections.OrderedDict()
    request["TrainingJobName.$"] = slot + ".name"
    algorithm = collections.OrderedDict([("TrainingImage.$", slot + ".request.image"), ("TrainingInputMode", "File")])
    if kind is TRAIN:
        algorithm["MetricDefinitions"] = job.METRIC_DEFINITIONS
        algorithm["EnableSageMakerMetricsTimeSeries"] = True
    request["AlgorithmSpecification"] = algorithm
    request["RoleArn"] = "${ExecutionRoleArn}"
    request["HyperParameters.$"] = slot + ".request.hyperparameters"
    if kind is TRAIN:
        request["InputDataConfig"] = [_channel(job.TRAIN_CHANNEL, "$.config.data_directory", "ro")]
    else:
        request["InputDataConfig"] = [
            _channel(job.PREPARE_INPUT_CHANNEL, "$.config.prepare.raw_directory", "ro"),
            _channel(job.PREPARE_OUTPUT_CHANNEL, "$.config.data_directory", "rw"),
        ]
    request["OutputDataConfig"] = {"S3OutputPath": artifact_uri("output")}
    request["ResourceConfig"] = collections.OrderedDict([
        ("InstanceType.$", kind.config + ".instance_type"), ("InstanceCount.$", kind.config + ".instance_count"),
        ("VolumeSizeInGB", VOLUME_SIZE_GB)])
    request["VpcConfig"] = vpc_config(settings)
    request["StoppingCondition.$"] = slot + ".request.stopping"
    if kind is TRAIN:
        request["EnableManagedSpotTraining.$"] = "$.config.spot"
        request["CheckpointConfig"] = {
            "S3Uri.$": asl.fmt(artifact_uri("checkpoints/") + "{}/", "$$.Execution.Name"),
            "LocalPath": "/opt/ml/checkpoints"}
    request["EnableInterContainerTrafficEncryption"] = True
    request["ProfilerConfig"] = {"S3OutputPath": artifact_uri("profiler"),
                                 "ProfilingIntervalInMilliseconds": PROFILING_INTERVAL_MS}
    if kind is TRAIN:
        request["ProfilerRuleConfigurations"] = [
            {"RuleConfigurationName": rule, "RuleEvaluatorImage": "${DebuggerRuleImage}",
             "RuleParameters": {"rule_to_invoke": rule}} for rule in PROFILER_RULES]
    extra = [{"Key": DATASET_KEY_TAG, "Value.$": "$.run.dataset_key"}] if kind is PREPARE else []
    request["Tags"] = tags(kind.kind, extra)
    return request


def request_states(kind, settings, first, next_state):
    """<slot>.request = {image, hyperparameters, stopping} for this attempt."""
    states = collections.OrderedDict()
    stopping = "%s.Stopping" % kind.state
    if kind is TRAIN:
        rules = []
        for strategy in job.STRATEGIES:
            runtime = job.STRATEGY_RUNTIME[strategy]
            if runtime not in settings.runtimes:
                continue  # rejected by the input validation
            name = "%s.Request.%s" % (kind.state, strategy)
            rules.append(asl.rule({"Variable": "$.config.strategy", "StringEquals": strategy}, name))
            states[name] = asl.pass_state(stopping, {
                "image": "${%s}" % image_placeholder(runtime),
                "hyperparameters": train_hyperparameters(strategy, settings)}, result_path=kind.slot + ".request")
        states[first] = asl.choice(rules, rules[-1]["Next"])
        states.move_to_end(first, last=False)
    else:
        states[first] = asl.pass_state(stopping, {
            "image": "${%s}" % image_placeholder(job.PREPARE_RUNTIME),
            "hyperparameters": prepare_hyperparameters(settings)}, result_path=kind.slot + ".request")
    runtime = kind.config + ".max_runtime_seconds"
    on_demand = {"MaxRuntimeInSeconds.$": runtime}
    target = kind.slot + ".request.stopping"
    if kind.spot_path:
        states[stopping] = asl.choice(
            [asl.rule({"Variable": kind.spot_path, "BooleanEquals": True}, stopping + ".Spot")],
            stopping + ".OnDemand")
        # Spot capacity may take as long as the run itself to come by.
        states[stopping + ".Spot"] = asl.pass_state(next_state, {
            "MaxRuntimeInSeconds.$": runtime,
            "MaxWaitTimeInSeconds.$": "States.MathAdd(%s, %s)" % (runtime, runtime)}, result_path=target)
        states[stopping + ".OnDemand"] = asl.pass_state(next_state, on_demand, result_path=target)
    else:
        states[stopping] = asl.pass_state(next_state, on_demand, result_path=target)
    return states


def with_defaults(name, next_state):
    """$.scratch (a whole describe result) merged over DESCRIBE_DEFAULTS[name]."""
    return asl.pass_state(next_state, {"job.$": "States.JsonMerge($.run.defaults.%s, $.scratch, false)" % name},
                          result_path="$.scratch")


def job_states(kind, settings, on_success):
    """Entered at `<State>.Start`; on success `<slot>.result` and `<slot>.metrics` are set."""
    s, slot = kind.state, kind.slot
    label = "%s job" % kind.kind
    name_path = slot + ".name"
    describe = asl.sdk("sagemaker", "describeTrainingJob")
    states = collections.OrderedDict()
    states[s + ".Start"] = asl.pass_state(s + ".Name", result={
        "attempt": 1, "retry_wait": CAPACITY_RETRY_SECONDS}, result_path=slot)
    states[s + ".Name"] = asl.pass_state(s + ".Request", {
        "attempt.$": slot + ".attempt", "retry_wait.$": slot + ".retry_wait",
        "name.$": asl.fmt("%s-%s-{}-{}" % (settings.name_prefix, kind.token), "$.run.id", slot + ".attempt"),
    }, result_path=slot)
    states.update(request_states(kind, settings, s + ".Request", s + ".Create"))
    states[s + ".Create"] = asl.task(
        asl.sdk("sagemaker", "createTrainingJob"), create_request(kind, settings), s + ".PollStart",
        catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": slot + ".error", "Next": s + ".CreateError"}])
    states[s + ".CreateError"] = asl.pass_state(s + ".IsCapacity", {
        "reason.$": asl.fmt("CreateTrainingJob failed: {}: {}", slot + ".error.Error", slot + ".error.Cause")},
        result_path=slot + ".failure")
    states[s + ".PollStart"] = asl.pass_state(s + ".Wait", result={"seconds": POLL_MIN_SECONDS, "secondary": ""},
                                              result_path=slot + ".poll")
    states[s + ".Wait"] = {"Type": "Wait", "SecondsPath": slot + ".poll.seconds", "Next": s + ".Describe"}
    states[s + ".Describe"] = asl.task(
        describe, {"TrainingJobName.$": name_path}, s + ".Check", result_path=slot + ".describe",
        result_selector={"status.$": "$.TrainingJobStatus", "secondary.$": "$.SecondaryStatus"},
        retry=RETRY)
    status = slot + ".describe.status"
    states[s + ".Check"] = asl.choice([
        asl.rule({"Variable": status, "StringEquals": "Completed"}, s + ".Result"),
        asl.rule({"Variable": status, "StringEquals": "Failed"}, s + ".Failed"),
        asl.rule({"Variable": status, "StringEquals": "Stopped"}, s + ".Stopped"),
        asl.rule(asl.negate({"Variable": slot + ".describe.secondary", "StringEqualsPath": slot + ".poll.secondary"}),
                 s + ".Phase"),
        asl.rule({"Variable": slot + ".poll.seconds", "NumericGreaterThanEquals": POLL_MAX_SECONDS}, s + ".Wait"),
    ], s + ".Backoff")
    states[s + ".Phase"] = asl.publish("${TopicArn}", asl.fmt(
        "%s {}: {} ({})" % label, name_path, slot + ".describe.secondary", status), s + ".PhaseSeen")
    states[s + ".PhaseSeen"] = asl.pass_state(s + ".Wait", {
        "seconds": POLL_MIN_SECONDS, "secondary.$": slot + ".describe.secondary"}, result_path=slot + ".poll")
    states[s + ".Backoff"] = asl.pass_state(s + ".Wait", {
        "seconds.$": "States.MathAdd(%s.poll.seconds, %s.poll.seconds)" % (slot, slot),
        "secondary.$": slot + ".poll.secondary"}, result_path=slot + ".poll")
    # Optional fields of DescribeTrainingJob get defaults: a missing JSONPath fails the execution.
    states[s + ".Failed"] = asl.task(describe, {"TrainingJobName.$": name_path}, s + ".FailedDefaults",
                                     result_path="$.scratch", retry=RETRY)
    states[s + ".FailedDefaults"] = with_defaults("failed_job", s + ".FailureReason")
    states[s + ".FailureReason"] = asl.pass_state(s + ".IsCapacity", {
        "reason.$": "$.scratch.job.FailureReason"}, result_path=slot + ".failure")
    states[s + ".Stopped"] = asl.pass_state(s + ".Notify", {
        "reason.$": asl.fmt("stopped ({})", slot + ".describe.secondary")}, result_path=slot + ".failure")
    states[s + ".IsCapacity"] = asl.choice([asl.rule(asl.any_of(*[
        {"Variable": slot + ".failure.reason", "StringMatches": pattern} for pattern in CAPACITY_PATTERNS]),
        s + ".Retry")], s + ".Notify")
    states[s + ".Retry"] = asl.choice([asl.rule(
        {"Variable": slot + ".attempt", "NumericGreaterThanEquals": MAX_ATTEMPTS}, s + ".Notify")], s + ".RetryWait")
    states[s + ".RetryWait"] = {"Type": "Wait", "SecondsPath": slot + ".retry_wait", "Next": s + ".NextAttempt"}
    states[s + ".NextAttempt"] = asl.pass_state(s + ".Name", {
        "attempt.$": "States.MathAdd(%s.attempt, 1)" % slot,
        "retry_wait.$": "States.MathAdd(%s.retry_wait, %s.retry_wait)" % (slot, slot)}, result_path=slot)
    cause = asl.fmt("%s {} (attempt {} of at most %d) failed: {}" % (label, MAX_ATTEMPTS),
                    name_path, asl.to_json(slot + ".attempt"), slot + ".failure.reason")
    states[s + ".Notify"] = asl.publish("${TopicArn}", cause, s + ".Fail")
    states[s + ".Fail"] = asl.fail("%sJobFailed" % s, cause)

    states[s + ".Result"] = asl.task(describe, {"TrainingJobName.$": name_path}, s + ".ResultDefaults",
                                     result_path="$.scratch", retry=RETRY)
    states[s + ".ResultDefaults"] = with_defaults("completed_job", s + ".Metrics")
    states[s + ".Metrics"] = {
        "Type": "Map", "ItemsPath": "$.scratch.job.FinalMetricDataList",
        "ItemSelector": {"name.$": "$$.Map.Item.Value.MetricName", "value.$": "$$.Map.Item.Value.Value"},
        "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": "Metric",
                          "States": {"Metric": {"Type": "Pass", "End": True}}},
        "ResultPath": slot + ".metrics", "Next": s + ".Outputs"}
    states[s + ".Outputs"] = asl.pass_state(s + ".Succeeded", {
        "model_artifacts.$": "$.scratch.job.ModelArtifacts.S3ModelArtifacts",
        "billable_seconds.$": "$.scratch.job.BillableTimeInSeconds",
        "training_seconds.$": "$.scratch.job.TrainingTimeInSeconds",
        "console_url.$": asl.fmt(
            "https://%s.console.aws.amazon.com/sagemaker/home?region=%s#/jobs/{}" % (settings.region, settings.region),
            name_path)}, result_path=slot + ".result")
    states[s + ".Succeeded"] = asl.publish("${TopicArn}", asl.fmt(
        "%s {} completed: model {}" % label, name_path, slot + ".result.model_artifacts"), on_success)
    return states
