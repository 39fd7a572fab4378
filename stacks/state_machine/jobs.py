"""A SageMaker training job as states: name, request, create, monitor loop, outcome.

Used twice by the main machine: the "prepare" job (lm.data.prepare) and the training job.

- Name per attempt: `<prefix>-<token>-<md5 of the execution ARN>-<attempt>` ([a-z0-9-],
  <= 57 chars with a 16-char prefix); the stop machine finds an execution's jobs by the hash.
- CreateTrainingJob runs through the AWS SDK integration (`aws-sdk:sagemaker:createTrainingJob`,
  request-response) rather than the optimized `sagemaker:createTrainingJob`: moto executes the
  optimized one only by forwarding and turns its errors into an uncatchable States.Runtime, so
  its error path could not be tested. A throttled create is retried as it is (THROTTLE_RETRY);
  other errors are caught whole. A quota (QUOTA_PATTERN: SageMaker's "account-level service
  limit", the normal state of GPU types on a new account) fails at once with a cause naming the
  Service Quotas limit to raise; a capacity error is recognized by its text (the create error
  or the job's FailureReason, CAPACITY_PATTERNS) and retried with a fresh name after a doubling
  wait, at most MAX_ATTEMPTS attempts in all.
- Fallback (training): when a type's capacity errors outlast MAX_ATTEMPTS, the gate plans the run for
  the input's next type (`fallback_instance_types`), whose config and plan replace the state's; the
  topic hears what changed. A quota is not capacity: it fails at once, whatever types are left.
- Monitor: Wait -> DescribeTrainingJob -> Choice. The wait starts at POLL_MIN_SECONDS and doubles up to
  the cap the gate computed for the run (`$.plan.poll`, `controlplane.history`: 15 minutes, longer for a
  run that may last longer), so the longest run the input allows fits 70 % of the 25,000 events of a
  Standard execution (tests/aws/test_history_budget.py); SecondaryStatus changes are notified to SNS.
- The gate: `gate_task` invokes its Lambda function's published version (`${GateFunctionArn}`),
  retrying Lambda's own transient errors (LAMBDA_RETRY).
"""
import collections
import dataclasses

from controlplane import budget
from controlplane import base_images
from controlplane import checkpoint_plan, history, presets, request
from controlplane.inputs import TOP_LEVEL_HYPERPARAMETERS
from controlplane import evaluation as controlplane_evaluation
from lm.spec import drill, evaluation, job
from lm.spec.hardware import INSTANCES
from stacks.state_machine import asl, bill
from stacks.state_machine.names import image_placeholder, subnet_placeholder

MAX_ATTEMPTS = 4  # per instance type
CAPACITY_RETRY_SECONDS = 120
# ResourceLimitExceeded: "The account-level service limit '<instance type> for training job usage' is 0
# Instances, with current utilization of 0 Instances and a request delta of 1 Instances. ..." (SageMaker's text;
# the limit is a quota of the account in Service Quotas, raised on request, so waiting does not help).
QUOTA_PATTERN = "*account-level service limit*"
CAPACITY_PATTERNS = ("*ResourceLimitExceeded*", "*CapacityError*", "*InsufficientInstanceCapacity*",
                     "*insufficient capacity*")
RETRY = [{"ErrorEquals": ["States.ALL"], "IntervalSeconds": 10, "MaxAttempts": 6, "BackoffRate": 2}]
# Calls that must not simply be repeated on any error (a create, a stop) retry only a throttled request,
# which SageMaker refused before doing anything. An AWS SDK integration names its errors
# <Service>.<Error>Exception ("AWS SDK service integrations", Step Functions Developer Guide);
# ThrottlingException is among SageMaker's common errors (SageMaker API Reference, "Common Errors").
THROTTLED = "SageMaker.ThrottlingException"
THROTTLE_RETRY = [{"ErrorEquals": [THROTTLED], "IntervalSeconds": 5, "MaxAttempts": 8, "BackoffRate": 2,
                   "MaxDelaySeconds": 300, "JitterStrategy": "FULL"}]
# Lambda's transient errors, the four of the Step Functions developer guide's "Handle Lambda service
# exceptions" (bp-lambda-serviceexception) for a Task that invokes a function, and its note's
# TooManyRequestsException (Lambda at its concurrency): the invocation did not run the function, so it is
# repeated; the function's own errors (Lambda.Unknown: a timeout, out of memory) are not.
LAMBDA_SERVICE_ERRORS = ["Lambda.ClientExecutionTimeoutException", "Lambda.ServiceException",
                         "Lambda.AWSLambdaException", "Lambda.SdkClientException", "Lambda.TooManyRequestsException"]
LAMBDA_RETRY = [{"ErrorEquals": LAMBDA_SERVICE_ERRORS, "IntervalSeconds": 1, "MaxAttempts": 6, "BackoffRate": 2,
                 "JitterStrategy": "FULL"}]
GATE_FAILED = "GateFailed"  # the gate's function itself failed (not a refusal): its error is the cause
POLL_PLAN = "$.plan.poll"  # the monitor's waits for this run (controlplane.gate.check_history)
# Defaults for the optional fields of describe results (kept in $.run.defaults: intrinsics
# take no object literals).
# What the bill reads of every job that ended (stacks.state_machine.bill.usage_state).
BILLED_DEFAULTS = {"BillableTimeInSeconds": None, "TrainingTimeInSeconds": None, "FinalMetricDataList": []}
DESCRIBE_DEFAULTS = {
    "failed_job": dict(BILLED_DEFAULTS, FailureReason="no FailureReason given"),
    "stopped_job": BILLED_DEFAULTS,
    "completed_job": dict(BILLED_DEFAULTS, MlflowDetails={"MlflowRunId": None}),
    "failed_endpoint": {"FailureReason": "no FailureReason given"},
}
METRIC_DEFAULTS = {"MetricName": "unnamed", "Value": None}
# The end of a failed training run's cause ({}: the checkpoint prefix's name).
RESUME_HINT = ("Its checkpoints are kept: to continue from the newest, start a new execution with the same "
               "input plus \"resume_from\": \"{}\"")


class JobKind(collections.namedtuple("JobKind", "state token slot kind config spot_path")):
    """state: state-name prefix; token: in the job name; slot: where its state lives;
    kind: controlplane.request.JOB_KINDS key; config: its settings in $.config; spot_path: or None."""


RAW_S3_URI_PATH = "$.config.prepare.raw_s3_uri"  # null: the raw files are on EFS (raw_directory)
INIT_FROM_PATH = "$.config.init_from"  # null: training starts from random weights, prepare needs a tokenizer
DATASET_KEY_PATH = "$.run.dataset.key"  # what the prepare job is tagged with (stacks.state_machine.training)
# The checkpoint prefix's name below checkpoints/: resume_from, or the execution's own name.
CHECKPOINTS_PATH = "$.run.checkpoints.name"
TRAINING_PLAN_PATH = "$.config.training_plan_arn"  # null: on-demand (or spot) capacity
DRILL_FAULTS_PATH = "$.config.drill.faults"  # null: no drill (lm.spec.drill), the job's environment lacks it
MODEL_CONFIG_PATH = "$.plan.model_config"  # the preset's configuration, as the gate planned the run
STOP_AFTER_PATH = "$.plan.stop_after_seconds"  # the job's deadline (controlplane.budget)
# Where the execution holds the hyperparameters the gate resolves (controlplane.inputs.RESOLVED_HYPERPARAMETERS).
RESOLVED_PATHS = {"model_config": MODEL_CONFIG_PATH, "stop_after_seconds": STOP_AFTER_PATH}
PROCESSES_PER_HOST_PATH = "$.plan.processes_per_host"
TRAIN = JobKind("Train", "train", "$.train", "train", "$.config", "$.config.spot")
PREPARE = JobKind("Prepare", "prep", "$.prepare", "prepare", "$.config.prepare", None)
EVALUATE = JobKind("Evaluate", "eval", "$.evaluate", "evaluate", "$.config.evaluate", None)
EVALUATION_PLAN = "$.plan.evaluate"  # what the gate planned for the evaluation job (controlplane.evaluation.plan)
TASK_DATA_PATH = "$.config.evaluate.data_s3_uri"  # null: no tasks, only the validation documents' bits per byte
# The end of a failed evaluation's cause ({}: the trained model, which it leaves as it was).
KEPT_MODEL_HINT = ("The trained model is kept: {}; to serve it without evaluation, start an execution with "
                   "deploy.enabled true and deploy.model_artifact set to it")


def hyperparameter_path(name):
    """Where the execution holds the training hyperparameter `name`."""
    if name in RESOLVED_PATHS:
        return RESOLVED_PATHS[name]
    return "$.config.%s" % name if name in TOP_LEVEL_HYPERPARAMETERS else "$.config.hyperparameters.%s" % name


def job_values(kind, settings, value_at, strategy="single"):
    """The `controlplane.request.TrainingJob` of one attempt of `kind` with `strategy`.

    `value_at(path)` gives what the execution holds at a JSONPath: `controlplane.request.Path` when the
    definition is generated, the concrete value when a test builds the request itself
    (`controlplane.request.values_at`). `${Name}` placeholders are filled by the CDK at deploy time.
    """
    if kind is TRAIN:
        hyperparameters = collections.OrderedDict((name, value_at(hyperparameter_path(name))) for name in job.HYPERPARAMETERS)
        runtime = base_images.STRATEGY_RUNTIME[strategy]
    elif kind is EVALUATE:
        hyperparameters = collections.OrderedDict((name, value_at("%s.%s" % (EVALUATION_PLAN, name))) for name in (
            evaluation.TASKS_ARGUMENT, evaluation.LIMIT_ARGUMENT, evaluation.BATCH_SIZE_ARGUMENT))
        runtime = base_images.EVALUATION_RUNTIME
    else:
        hyperparameters = collections.OrderedDict(
            (name, value_at("$.config.prepare.hyperparameters.%s" % name)) for name in job.PREPARE_HYPERPARAMETERS)
        runtime = base_images.PREPARE_RUNTIME
    return request.TrainingJob(
        kind=kind.kind, name=value_at(kind.slot + ".name"), image="${%s}" % image_placeholder(runtime),
        role_arn="${ExecutionRoleArn}", bucket="${ArtifactBucket}", region=settings.region,
        hyperparameters=hyperparameters, instance_type=value_at(kind.config + ".instance_type"),
        instance_count=1 if kind is EVALUATE else value_at(kind.config + ".instance_count"),
        max_runtime_seconds=value_at(kind.config + ".max_runtime_seconds"),
        spot=value_at(kind.spot_path) if kind.spot_path else False,
        traffic_encryption=settings.inter_container_traffic_encryption,
        file_system_id="${FileSystemId}", security_group_ids=vpc_config(settings)["SecurityGroupIds"],
        subnets=vpc_config(settings)["Subnets"],
        data_directory=value_at("$.config.data_directory"), execution_name=value_at("$$.Execution.Name"),
        strategy=strategy, processes_per_host=value_at(PROCESSES_PER_HOST_PATH),
        mp_parameters=value_at("$.config.mp_parameters"),
        raw_directory=value_at("$.config.prepare.raw_directory") if kind is PREPARE else None,
        raw_s3_uri=value_at(RAW_S3_URI_PATH) if kind is PREPARE else None,
        dataset_key=value_at(DATASET_KEY_PATH) if kind is PREPARE else None,
        init_from=None if kind is EVALUATE else value_at(INIT_FROM_PATH), checkpoints=value_at(CHECKPOINTS_PATH) if kind is TRAIN else None,
        infra_check=value_at("$.config.infra_check") if kind is TRAIN else None,
        keep_alive_seconds=value_at("$.config.keep_alive_seconds") if kind is TRAIN else None,
        training_plan_arn=value_at(TRAINING_PLAN_PATH) if kind is TRAIN else None,
        mlflow_arn=settings.mlflow_resource_arn if kind is not PREPARE else None,
        mlflow_experiment=value_at("$.config.mlflow_experiment") if kind is not PREPARE else None,
        **(_evaluation_values(value_at) if kind is EVALUATE else {}))


def _evaluation_values(value_at):
    """The evaluation job's own values: the training job's model and name, its tasks' data and metrics."""
    return dict(model_artifact=value_at(TRAIN.slot + ".result.model_artifacts"),
                task_data_s3_uri=value_at(TASK_DATA_PATH),
                metric_definitions=value_at(EVALUATION_PLAN + ".metric_definitions"),
                mlflow_run_name=value_at(TRAIN.slot + ".name"))


def concrete_values(kind, settings, config, *, job_name, execution_name, dataset_key=None, trained=None):
    """`job_values` for one attempt of a concrete execution: `config` is the input with its
    defaults, as the gate leaves it in `$.config` (`controlplane.gate.decide(...).config`), where the gate makes
    the mean time between interruptions explicit (`controlplane.checkpoint_plan`); for the evaluation job `trained`
    is (the training job's name, its model.tar.gz)."""
    config = dict(config, hyperparameters=dict(config["hyperparameters"]))
    checkpoint_plan.resolve_interruption_hours(config)
    state = {
        "config": config,
        "plan": {"processes_per_host": job.processes_per_host("horovod", INSTANCES[config["instance_type"]].gpus),
                 "model_config": presets.model_config(config["preset"]),
                 "stop_after_seconds": budget.stop_after_seconds(config["max_runtime_seconds"]),
                 "evaluate": controlplane_evaluation.check(config, deploy_only=False)},
        "run": {"dataset": {"key": dataset_key},
                "checkpoints": {"name": config["resume_from"] or execution_name}},
        kind.slot[len("$."):]: {"name": job_name},
    }
    if trained:
        state[TRAIN.slot[len("$."):]] = {"name": trained[0], "result": {"model_artifacts": trained[1]}}
    value_at = request.values_at(state, {"Execution": {"Name": execution_name}})
    return job_values(kind, settings, value_at, config["strategy"] if kind is TRAIN else "single")


def vpc_config(settings, security_group="SecurityGroupId"):
    """The VpcConfig of a job (the training security group) or, with "HostingSecurityGroupId", of a model."""
    return request.vpc_config(["${%s}" % security_group],
                              ["${%s}" % subnet_placeholder(index) for index in range(settings.subnet_count)])


def tags(kind):
    return asl.parameters(request.resource_tags(kind, request.Path("$$.Execution.Name")))


def create_request(kind, settings):
    """CreateTrainingJob Parameters; image, hyperparameters, channels, tags and stopping were put in
    <slot>.request."""
    request_slot = kind.slot + ".request"
    values = dataclasses.replace(job_values(kind, settings, request.Path),
                                 image=request.Path(request_slot + ".image"))
    return asl.parameters(request.create_training_job_request(
        values, hyperparameter_map=request.Path(request_slot + ".hyperparameters"),
        stopping=request.Path(request_slot + ".stopping"), channels=request.Path(request_slot + ".channels"),
        job_tags=request.Path(request_slot + ".tags"), resources=request.Path(request_slot + ".resources")))


def drill_request(parameters):
    """The CreateTrainingJob Parameters of a divergence drill: LMSTACK_FAULTS added to the Environment."""
    drilled = collections.OrderedDict(parameters)
    drilled["Environment"] = collections.OrderedDict(parameters.get("Environment", {}))
    drilled["Environment"][drill.FAULTS_ENVIRONMENT + ".$"] = DRILL_FAULTS_PATH
    return drilled


def request_states(kind, settings, first, next_state):
    """<slot>.request = {image, hyperparameters, channels, tags, stopping} for this attempt."""
    states = collections.OrderedDict()
    stopping = "%s.Stopping" % kind.state

    def request_state(strategy, **changes):
        values = dataclasses.replace(job_values(kind, settings, request.Path, strategy), **changes)
        return asl.pass_state(stopping, {"image": values.image,
                                         "hyperparameters": asl.parameters(request.hyperparameters(values)),
                                         "channels": asl.parameters(request.input_channels(values)),
                                         "tags": asl.parameters(request.tags(values))},
                              result_path=kind.slot + ".request")

    if kind is TRAIN:
        rules = []
        for strategy in job.STRATEGIES:
            if base_images.STRATEGY_RUNTIME[strategy] not in settings.runtimes:
                continue  # rejected by the input validation
            name = "%s.Request.%s" % (kind.state, strategy)
            rules.append(asl.rule({"Variable": "$.config.strategy", "StringEquals": strategy}, name))
            # init_from: with an S3 channel of the Hugging Face directory, or training from scratch
            states[name] = asl.choice([asl.rule({"Variable": INIT_FROM_PATH, "IsNull": False}, name + ".Init")],
                                      name + ".Scratch")
            states[name + ".Init"] = request_state(strategy)
            states[name + ".Scratch"] = request_state(strategy, init_from=None)
        states[first] = asl.choice(rules, rules[-1]["Next"])
        states.move_to_end(first, last=False)
    elif kind is EVALUATE:  # the tasks' data (an S3 channel) or none
        states[first] = asl.choice([asl.rule({"Variable": TASK_DATA_PATH, "IsNull": False}, first + ".Tasks")],
                                   first + ".NoTasks")
        states[first + ".Tasks"] = request_state("single")
        states[first + ".NoTasks"] = request_state("single", task_data_s3_uri=None)
    else:  # the raw files from S3 (an S3 channel) or from EFS; the tokenizer of init_from (its channel) or not
        from_s3 = {"Variable": RAW_S3_URI_PATH, "IsNull": False}
        with_init = {"Variable": INIT_FROM_PATH, "IsNull": False}
        states[first] = asl.choice([asl.rule(asl.all_of(from_s3, with_init), first + ".S3.Init"),
                                    asl.rule(from_s3, first + ".S3"),
                                    asl.rule(with_init, first + ".EFS.Init")], first + ".EFS")
        states[first + ".S3.Init"] = request_state("single")
        states[first + ".S3"] = request_state("single", init_from=None)
        states[first + ".EFS.Init"] = request_state("single", raw_s3_uri=None)
        states[first + ".EFS"] = request_state("single", raw_s3_uri=None, init_from=None)
    runtime = request.Path(kind.config + ".max_runtime_seconds")
    target = kind.slot + ".request.stopping"
    resources = "%s.Resources" % kind.state

    def stopping_state(spot):
        return asl.pass_state(resources, asl.parameters(request.stopping_condition(runtime, spot)),
                              result_path=target)

    def resources_state(**changes):
        values = dataclasses.replace(job_values(kind, settings, request.Path), **changes)
        return asl.pass_state(next_state, asl.parameters(request.resource_config(values)),
                              result_path=kind.slot + ".request.resources")

    if kind.spot_path:
        states[stopping] = asl.choice(
            [asl.rule({"Variable": kind.spot_path, "BooleanEquals": True}, stopping + ".Spot")],
            stopping + ".OnDemand")
        states[stopping + ".Spot"] = stopping_state(True)
        states[stopping + ".OnDemand"] = stopping_state(False)
    else:
        states[stopping] = stopping_state(False)
    if kind is TRAIN:  # TrainingPlanArn only when the input names a training plan
        states[resources] = asl.choice([asl.rule({"Variable": TRAINING_PLAN_PATH, "IsNull": False},
                                                 resources + ".Plan")], resources + ".OnDemand")
        states[resources + ".Plan"] = resources_state()
        states[resources + ".OnDemand"] = resources_state(training_plan_arn=None)
    else:
        states[resources] = resources_state()
    return states


def gate_task(payload, next_state, result_path, failed_state):
    """Invoke the gate (`controlplane.gate.handler`) with `payload`; its answer at `<result_path>.answer`.
    An error of the function itself (not a refusal) goes to `failed_state`, a Fail state added here."""
    return asl.task("arn:aws:states:::lambda:invoke", {"FunctionName": "${GateFunctionArn}", "Payload": payload},
                    next_state, result_path=result_path, result_selector={"answer.$": "$.Payload"},
                    retry=LAMBDA_RETRY, catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": "$.gate_error",
                                                "Next": failed_state}])


def with_defaults(name, next_state):
    """$.scratch (a whole describe result) merged over DESCRIBE_DEFAULTS[name]."""
    return asl.pass_state(next_state, {"job.$": "States.JsonMerge($.run.defaults.%s, $.scratch, false)" % name},
                          result_path="$.scratch")


def _monitor_states(kind, first):
    """Wait -> DescribeTrainingJob -> Check, entered at `first`; leaves to `<State>.Result`, `.Failed` or
    `.Stopped`. The wait doubles from the gate's POLL_MIN_SECONDS up to its cap ($.plan.poll: how long the
    run may last decides it, `controlplane.history`); each of the job's first `phase_resets` SecondaryStatus
    changes is notified and starts the wait over, later ones are notified and set it to the cap (a job whose
    status keeps changing cannot hold the wait short)."""
    s, slot = kind.state, kind.slot
    poll, status = slot + ".poll", slot + ".describe.status"
    secondary = slot + ".describe.secondary"
    describe = asl.sdk("sagemaker", "describeTrainingJob")
    label = "%s job" % kind.kind

    def poll_state(seconds, secondary_path, resets):
        values = {"secondary.$": secondary_path, "resets.$": resets}
        values.update({"seconds.$": seconds} if isinstance(seconds, str) else {"seconds": seconds})
        return asl.pass_state(s + ".Wait", values, result_path=poll)

    changed = asl.negate({"Variable": secondary, "StringEqualsPath": poll + ".secondary"})
    notice = asl.fmt("%s {}: {} ({})" % label, slot + ".name", secondary, status)
    states = collections.OrderedDict()
    states[first] = asl.pass_state(s + ".Wait", result={"seconds": history.POLL_MIN_SECONDS, "secondary": "",
                                                        "resets": 0}, result_path=poll)
    states[s + ".Wait"] = {"Type": "Wait", "SecondsPath": poll + ".seconds", "Next": s + ".Describe"}
    states[s + ".Describe"] = asl.task(
        describe, {"TrainingJobName.$": slot + ".name"}, s + ".Check", result_path=slot + ".describe",
        result_selector={"status.$": "$.TrainingJobStatus", "secondary.$": "$.SecondaryStatus"}, retry=RETRY)
    states[s + ".Check"] = asl.choice([
        asl.rule({"Variable": status, "StringEquals": "Completed"}, s + ".Result"),
        asl.rule({"Variable": status, "StringEquals": "Failed"}, s + ".Failed"),
        asl.rule({"Variable": status, "StringEquals": "Stopped"}, s + ".Stopped"),
        asl.rule(asl.all_of(changed, {"Variable": poll + ".resets", "NumericLessThanPath": POLL_PLAN + ".phase_resets"}),
                 s + ".Phase"),
        asl.rule(changed, s + ".PhaseLate"),
        asl.rule({"Variable": poll + ".seconds", "NumericGreaterThanEqualsPath": POLL_PLAN + ".max_seconds"},
                 s + ".Wait"),
        asl.rule({"Variable": poll + ".seconds", "NumericGreaterThanPath": POLL_PLAN + ".half_max_seconds"},
                 s + ".PollCap"),
    ], s + ".Backoff")
    states[s + ".Phase"] = asl.publish("${TopicArn}", notice, s + ".PhaseSeen")
    states[s + ".PhaseSeen"] = asl.pass_state(s + ".Wait", {
        "seconds": history.POLL_MIN_SECONDS, "secondary.$": secondary,
        "resets.$": "States.MathAdd(%s.resets, 1)" % poll}, result_path=poll)
    states[s + ".PhaseLate"] = asl.publish("${TopicArn}", notice, s + ".PhaseKept")
    states[s + ".PhaseKept"] = poll_state(POLL_PLAN + ".max_seconds", secondary, poll + ".resets")
    states[s + ".Backoff"] = poll_state("States.MathAdd(%s.seconds, %s.seconds)" % (poll, poll), poll + ".secondary",
                                        poll + ".resets")
    states[s + ".PollCap"] = poll_state(POLL_PLAN + ".max_seconds", poll + ".secondary", poll + ".resets")
    return states


def _fallback_states(kind, first, exhausted):
    """The next instance type of the input once a type's capacity errors outlast MAX_ATTEMPTS: the gate plans
    the run for it (`controlplane.gate.fallback_launch`), its config and plan replace the state's, the topic
    hears what changed, and its attempts start. Without one left: `exhausted`."""
    s, slot = kind.state, kind.slot
    states = collections.OrderedDict()
    states[first] = asl.choice([asl.rule({"Variable": slot + ".next_launch", "NumericLessThanPath": "$.launches"},
                                         s + ".Replan")], exhausted)
    states[s + ".Replan"] = gate_task({"input.$": "$$.Execution.Input", "execution_name.$": "$$.Execution.Name",
                                       "launch.$": slot + ".next_launch"}, s + ".Replanned", "$.scratch",
                                      s + ".ReplanFailed")
    states[s + ".ReplanFailed"] = asl.fail(GATE_FAILED, "$.gate_error.Cause")
    states[s + ".Replanned"] = asl.choice([asl.rule({"Variable": "$.scratch.answer.ok", "BooleanEquals": False},
                                                    s + ".ReplanRefused")], s + ".Relaunch")
    states[s + ".ReplanRefused"] = {"Type": "Fail", "ErrorPath": "$.scratch.answer.error",
                                    "CausePath": "$.scratch.answer.cause"}
    # InputPath picks the answer's part; ResultPath puts it into the state's whole input.
    states[s + ".Relaunch"] = {"Type": "Pass", "InputPath": "$.scratch.answer.config", "ResultPath": "$.config",
                               "Next": s + ".RelaunchPlan"}
    states[s + ".RelaunchPlan"] = {"Type": "Pass", "InputPath": "$.scratch.answer.plan", "ResultPath": "$.plan",
                                   "Next": s + ".Relaunched"}
    states[s + ".Relaunched"] = asl.publish("${TopicArn}", asl.fmt(
        "%s job: no capacity for {} after %d attempts (the last: {}); training on {} with its own plan: {}"
        % (kind.kind, MAX_ATTEMPTS), slot + ".instance_type", slot + ".failure.reason", "$.config.instance_type",
        "$.plan.changes"), s + ".NextLaunch")
    states[s + ".NextLaunch"] = asl.pass_state(s + ".Name", {
        "attempt.$": "States.MathAdd(%s.attempt, 1)" % slot, "tries": 1, "retry_wait": CAPACITY_RETRY_SECONDS,
        "launch.$": slot + ".next_launch", "next_launch.$": "States.MathAdd(%s.next_launch, 1)" % slot}, result_path=slot)
    return states


def job_states(kind, settings, on_success):
    """Entered at `<State>.Start`; on success `<slot>.result` and `<slot>.metrics` are set.

    `<slot>`: `attempt` (every attempt of the job, in its name), `tries` (those on this instance type),
    `retry_wait`, `launch` (the instance type: 0 instance_type, k fallback_instance_types[k - 1]) and
    `next_launch`."""
    s, slot = kind.state, kind.slot
    label = "%s job" % kind.kind
    name_path = slot + ".name"
    describe = asl.sdk("sagemaker", "describeTrainingJob")
    states = collections.OrderedDict()
    states[s + ".Start"] = asl.pass_state(s + ".Name", result={
        "attempt": 1, "tries": 1, "retry_wait": CAPACITY_RETRY_SECONDS, "launch": 0, "next_launch": 1},
        result_path=slot)
    states[s + ".Name"] = asl.pass_state(s + ".Request", {
        "attempt.$": slot + ".attempt", "tries.$": slot + ".tries", "retry_wait.$": slot + ".retry_wait",
        "launch.$": slot + ".launch", "next_launch.$": slot + ".next_launch",
        "instance_type.$": kind.config + ".instance_type",
        "name.$": asl.fmt("%s-%s-{}-{}" % (settings.name_prefix, kind.token), "$.run.id", slot + ".attempt"),
    }, result_path=slot)
    creates = {s + ".Create": create_request(kind, settings)}
    if kind is TRAIN:  # a drill's faults in the environment, only when the input asks for one
        states.update(request_states(kind, settings, s + ".Request", s + ".Drill"))
        states[s + ".Drill"] = asl.choice([asl.rule({"Variable": DRILL_FAULTS_PATH, "IsNull": False},
                                                    s + ".Create.Drill")], s + ".Create")
        creates[s + ".Create.Drill"] = drill_request(creates[s + ".Create"])
    else:
        states.update(request_states(kind, settings, s + ".Request", s + ".Create"))
    for name, parameters in creates.items():
        states[name] = asl.task(
            asl.sdk("sagemaker", "createTrainingJob"), parameters, s + ".PollStart", retry=THROTTLE_RETRY,
            catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": slot + ".error", "Next": s + ".CreateError"}])
    states[s + ".CreateError"] = asl.pass_state(s + ".IsCapacity", {
        "reason.$": asl.fmt("CreateTrainingJob failed: {}: {}", slot + ".error.Error", slot + ".error.Cause")},
        result_path=slot + ".failure")
    states.update(_monitor_states(kind, s + ".PollStart"))
    # Optional fields of DescribeTrainingJob get defaults: a missing JSONPath fails the execution.
    states[s + ".Failed"] = asl.task(describe, {"TrainingJobName.$": name_path}, s + ".FailedDefaults",
                                     result_path="$.scratch", retry=RETRY)
    states[s + ".FailedDefaults"] = with_defaults("failed_job", s + ".FailedUsage")
    states[s + ".FailedUsage"] = bill.usage_state(kind, s + ".FailureReason", one_instance=kind is EVALUATE)
    states[s + ".FailureReason"] = asl.pass_state(s + ".IsCapacity", {
        "reason.$": "$.scratch.job.FailureReason"}, result_path=slot + ".failure")
    states[s + ".Stopped"] = asl.task(describe, {"TrainingJobName.$": name_path}, s + ".StoppedDefaults",
                                      result_path="$.scratch", retry=RETRY)
    states[s + ".StoppedDefaults"] = with_defaults("stopped_job", s + ".StoppedUsage")
    states[s + ".StoppedUsage"] = bill.usage_state(kind, s + ".StoppedReason", one_instance=kind is EVALUATE)
    states[s + ".StoppedReason"] = asl.pass_state(s + ".Bill", {
        "reason.$": asl.fmt("stopped ({})", slot + ".describe.secondary")}, result_path=slot + ".failure")
    states[s + ".IsCapacity"] = asl.choice([
        asl.rule({"Variable": slot + ".failure.reason", "StringMatches": QUOTA_PATTERN}, s + ".Quota"),
        asl.rule(asl.any_of(*[{"Variable": slot + ".failure.reason", "StringMatches": pattern}
                              for pattern in CAPACITY_PATTERNS]), s + ".Retry"),
    ], s + ".Bill")
    states[s + ".Quota"] = asl.pass_state(s + ".Bill", {"reason.$": asl.fmt(
        "an account quota, not capacity (not retried): in Service Quotas, request an increase of the Amazon "
        "SageMaker quota named below; for instance type {} that is \"{} for training job usage\" (\"{} for spot "
        "training job usage\" with spot). {}", *([kind.config + ".instance_type"] * 3 + [slot + ".failure.reason"]))},
        result_path=slot + ".failure")
    # A training job whose type keeps failing for capacity falls back to the input's next type.
    exhausted = s + ".Fallback" if kind is TRAIN else s + ".Bill"
    states[s + ".Retry"] = asl.choice([asl.rule(
        {"Variable": slot + ".tries", "NumericGreaterThanEquals": MAX_ATTEMPTS}, exhausted)], s + ".RetryWait")
    states[s + ".RetryWait"] = {"Type": "Wait", "SecondsPath": slot + ".retry_wait", "Next": s + ".NextAttempt"}
    states[s + ".NextAttempt"] = asl.pass_state(s + ".Name", {
        "attempt.$": "States.MathAdd(%s.attempt, 1)" % slot, "tries.$": "States.MathAdd(%s.tries, 1)" % slot,
        "retry_wait.$": "States.MathAdd(%s.retry_wait, %s.retry_wait)" % (slot, slot),
        "launch.$": slot + ".launch", "next_launch.$": slot + ".next_launch"}, result_path=slot)
    if kind is TRAIN:
        states.update(_fallback_states(kind, exhausted, s + ".Bill"))
    template = "%s {} (attempt {} of at most %d on instance type {}) failed: {}" % (label, MAX_ATTEMPTS)
    # the end of a failed run: its bill, then the notification and the cause, which hold the bill's text
    arguments = [name_path, asl.to_json(slot + ".tries"), slot + ".instance_type", slot + ".failure.reason",
                 bill.BILL_PATH + ".text"]
    template += ". {}"
    if kind is TRAIN:  # an execution name cannot be used again: the way back to the training done so far
        template, arguments = template + ". " + RESUME_HINT, arguments + [CHECKPOINTS_PATH]
    if kind is EVALUATE:
        template, arguments = template + ". " + KEPT_MODEL_HINT, arguments + [TRAIN.slot + ".result.model_artifacts"]
    states.update(bill.states(settings, s + ".Bill", s + ".Notify", notify=False, retries=(LAMBDA_RETRY, RETRY)))
    cause = asl.fmt(template, *arguments)
    states[s + ".Notify"] = asl.publish("${TopicArn}", cause, s + ".Fail")
    states[s + ".Fail"] = asl.fail("%sJobFailed" % s, cause)

    states[s + ".Result"] = asl.task(describe, {"TrainingJobName.$": name_path}, s + ".ResultDefaults",
                                     result_path="$.scratch", retry=RETRY)
    states[s + ".ResultDefaults"] = with_defaults("completed_job", s + ".Usage")
    states[s + ".Usage"] = bill.usage_state(kind, s + ".Metrics", one_instance=kind is EVALUATE)
    # MetricData's members are optional in the API too: each metric is merged over defaults first.
    states[s + ".Metrics"] = {
        "Type": "Map", "ItemsPath": "$.scratch.job.FinalMetricDataList",
        "ItemSelector": {"metric.$": "$$.Map.Item.Value", "defaults": METRIC_DEFAULTS},
        "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": s + ".Metric.Defaults", "States": {
            s + ".Metric.Defaults": asl.pass_state(s + ".Metric", {
                "metric.$": "States.JsonMerge($.defaults, $.metric, false)"}),
            s + ".Metric": asl.pass_state(None, {"name.$": "$.metric.MetricName", "value.$": "$.metric.Value"})}},
        "ResultPath": slot + ".metrics", "Next": s + ".Outputs"}
    states[s + ".Outputs"] = asl.pass_state(s + ".Succeeded", {
        "model_artifacts.$": "$.scratch.job.ModelArtifacts.S3ModelArtifacts",
        "billable_seconds.$": "$.scratch.job.BillableTimeInSeconds",
        "training_seconds.$": "$.scratch.job.TrainingTimeInSeconds",
        # The run SageMaker reports for MlflowConfig (DescribeTrainingJob MlflowDetails), null without.
        "mlflow_run_id.$": "$.scratch.job.MlflowDetails.MlflowRunId",
        "console_url.$": asl.fmt(
            "https://%s.console.aws.amazon.com/sagemaker/home?region=%s#/jobs/{}" % (settings.region, settings.region),
            name_path)}, result_path=slot + ".result")
    states[s + ".Succeeded"] = asl.publish("${TopicArn}", asl.fmt(
        # The final metrics: the losses, and the divergence defense's skipped steps and rollbacks (lm.training.divergence).
        "%s {} completed: model {}, final metrics {}" % label, name_path, slot + ".result.model_artifacts",
        asl.to_json(slot + ".metrics")), on_success)
    return states
