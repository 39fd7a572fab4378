"""Run the shipped definitions on moto's Step Functions engine, SageMaker and SNS mocked.

The engine is `lmstack.local_sfn.fast_engine` (its parse kept, its waits shortened to 10 ms
with the seconds asked for recorded), the one the demo uses. moto's SageMaker differs from
AWS in ways these tests must bridge, each by a fake that does only what the AWS API
reference documents for that call:
- a training job is stored `Completed` at once: `JobFake` moves each new job through a
  script of (TrainingJobStatus, SecondaryStatus, extra describe fields), one step per
  DescribeTrainingJob, by setting the attributes moto's job object renders;
- StopTrainingJob and UpdateEndpoint are missing: added as response handlers;
- Search applies only the first `Tags.*` filter of an expression: every filter is applied (AWS ands them);
- an endpoint is `InService` at once: each created or updated endpoint follows
  `endpoint_script` instead, one step per DescribeEndpoint;
- moto's engine loses its place when an execution is stopped between the steps of a Task
  state (it skips the stopped steps but still pops their results, and fails the execution
  with States.Runtime instead of aborting it): `JobFake.park` holds a job's next
  DescribeTrainingJob inside the call, so a test can stop the execution there, race-free.

moto is also kinder than AWS in two ways a first real run would hit; `StrictLayer` (active in
every test that uses the `engine` fixture) makes the engine behave as AWS documents:
- optional response fields: moto fills in every member of a SageMaker response, AWS returns an
  optional one only when it has a value (the API reference; "optional" here is a member that the
  botocore service model's output shape does not list in `required`). Each aws-sdk SageMaker
  result the engine hands the state machine keeps the required members and only those optional
  ones the test's scenario reports (the extras of a `JobFake` script step or `endpoint_script`
  step, a Search that matched something; in a Search record of a training job, the name and the tags
  its CreateTrainingJob request gave it: the TrainingJob shape's Tags, "An array of key-value pairs",
  Search API reference); everything else is stripped, nested structures too;
- input constraints: moto does not check a request's members against the limits of the API; the
  service refuses a string member longer than its maximum, shorter than its minimum or outside its
  pattern with a ValidationException ("1 validation error detected: Value '...' at 'endpointName'
  failed to satisfy constraint: Member must have length less than or equal to 63"; "Common
  Errors", SageMaker API reference). Every aws-sdk SageMaker call's top-level string members are
  checked against the service model's `max`, `min` and `pattern`, and refused that way;
- `States.ALL` in a Retry or Catch does not match `States.Runtime` nor `States.DataLimitExceeded`
  ("Handling errors in Step Functions workflows", Step Functions developer guide,
  docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html: "The States.ALL
  error type must appear alone in a Catcher and can't catch the States.DataLimitExceeded
  terminal error or Runtime error types"). moto retries and catches them; here the execution
  fails at once, and `StrictLayer.uncaught` records each such error;
- error names: an AWS SDK integration's error is `<Service>.<Error>` with an `Exception` suffix added
  where the error has none, service and error in PascalCase ("AWS SDK service integrations", Step
  Functions developer guide, docs.aws.amazon.com/step-functions/latest/dg/supported-services-awssdk.html:
  `SageMaker.ThrottlingException`, `SageMaker.ResourceLimitExceededException`). moto names the service
  by its lower-case API name and an error its botocore model does not list (ThrottlingException,
  ValidationException) `sagemaker.sagemakerException`; here SageMaker errors get the documented names.

Retry intervals are recorded in `retry_waits` (the seconds each retry asked for), not slept.
"""
import collections
import contextlib
import dataclasses
import functools
import json
import re
import threading
import types
from typing import Optional, Tuple

import boto3
import botocore.endpoint
from botocore.exceptions import ClientError
import jsonpath_ng
import jsonpath_ng.ext
import pytest
from moto import mock_aws
from moto.core.exceptions import JsonRESTError
from moto.core.responses import EmptyResult
from moto.sagemaker import models as sagemaker_models
from moto.sagemaker import responses as sagemaker_responses
from moto.stepfunctions.parser.asl.component.common.error_name import error_equals_decl
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import StatesErrorNameType
from moto.stepfunctions.parser.asl.component.common.path import result_path
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service_aws_sdk
from moto.stepfunctions.parser.asl.utils import json_path

import aws_rules
import quota_tables
from controlplane import bucket_layout
from controlplane import base_images
from lmstack import local_lambda, local_sfn
from lmstack.local_sfn import ACCOUNT, REGION
from stacks import gate_code
from stacks.state_machine import build_stop_definition, build_training_definition, render

# The clients of every Deployment come from one boto3 session: a new session loads and parses each
# service's model again (2.5 MB of JSON for SageMaker, about 2 s a Deployment). moto's stubber is among
# the handlers of every session (moto.core.models adds it to botocore's BUILTIN_HANDLERS at import), so
# these clients reach moto whenever a mock is active, as clients of a fresh session do.
_SESSION = boto3.session.Session(region_name=REGION)
# Source files a test edited in this process (tests/fork/recipe.py registers them: {file: source}): the gate's
# code is staged from the tree, then these replace their copies, as an edit of the files before `cdk synth`.
EDITED_SOURCES = {}
ROLE = "arn:aws:iam::%s:role/sfn" % ACCOUNT
EXECUTION_ROLE = "arn:aws:iam::%s:role/lmstack-sagemaker" % ACCOUNT


@dataclasses.dataclass(frozen=True)
class StandInSettings:
    """The attributes of `stacks.settings.Settings` the definitions may read, nothing else."""
    name_prefix: str = "lmstack"
    region: str = REGION
    az_count: int = 2
    runtimes: Tuple[str, ...] = tuple(base_images.RUNTIMES)
    default_preset: str = "tiny"
    default_strategy: str = "single"
    default_instance_type: str = "ml.g5.2xlarge"
    default_instance_count: int = 1
    default_max_runtime_seconds: int = 3600
    default_hyperparameters: Tuple = ()
    spot: bool = False
    inter_container_traffic_encryption: bool = True
    dataset_directory: str = "/datasets/sample"
    raw_data_prefixes: Tuple[str, ...] = ()
    mlflow_resource_arn: Optional[str] = None

    @property
    def subnet_count(self):
        return self.az_count


COMPLETED_EXTRA = {"BillableTimeInSeconds": 1234, "TrainingTimeInSeconds": 1300,
                   "FinalMetricDataList": [{"MetricName": "train:loss", "Value": 3.1},
                                           {"MetricName": "validation:loss", "Value": 3.3}]}
SUCCESS = [("InProgress", "Starting", {}), ("InProgress", "Downloading", {}), ("InProgress", "Training", {}),
           ("InProgress", "Training", {}), ("InProgress", "Training", {}), ("InProgress", "Uploading", {}),
           ("Completed", "Completed", COMPLETED_EXTRA)]


def _attribute(field):
    return "".join("_" + char.lower() if char.isupper() else char for char in field).lstrip("_")


# Errors `States.ALL` does not match on AWS (module docstring).
TERMINAL_ERRORS = (StatesErrorNameType.StatesRuntime, StatesErrorNameType.StatesStatesDataLimitExceeded)


def required_only(shape, value, reported=()):
    """`value` (a response of botocore `shape`) without the members `shape` does not require,
    at every depth; the top-level members named in `reported` are kept whole."""
    if shape.type_name == "structure" and isinstance(value, dict):
        return {name: item if name in reported else required_only(shape.members[name], item)
                for name, item in value.items() if name in shape.required_members or name in reported}
    if shape.type_name == "list" and isinstance(value, list):
        return [required_only(shape.member, item) for item in value]
    if shape.type_name == "map" and isinstance(value, dict):
        return {key: required_only(shape.value, item) for key, item in value.items()}
    return value


def _java_pattern(pattern):
    """A service model pattern as a Python regular expression applied to the whole value, or None
    where Python's `re` cannot read it (the \\p{...} classes)."""
    try:
        return re.compile("(?:%s)\\Z" % pattern)
    except re.error:
        return None


def constraint_violations(operation, parameters):
    """The service's ValidationException texts for the top-level string members of a request."""
    shape = local_sfn.SAGEMAKER_MODEL.operation_model(operation).input_shape
    found = []
    for name, value in parameters.items():
        member = shape.members.get(name)
        if member is None or member.type_name != "string" or not isinstance(value, str):
            continue
        at = "Value '%s' at '%s' failed to satisfy constraint: Member must" % (value, name[0].lower() + name[1:])
        limits = member.metadata
        if "max" in limits and len(value) > limits["max"]:
            found.append("%s have length less than or equal to %d" % (at, limits["max"]))
        if "min" in limits and len(value) < limits["min"]:
            found.append("%s have length greater than or equal to %d" % (at, limits["min"]))
        pattern = _java_pattern(limits["pattern"]) if "pattern" in limits else None
        if pattern and not pattern.match(value):
            found.append("%s satisfy regular expression pattern: %s" % (at, limits["pattern"]))
    return found


class StrictLayer:
    """What the engine's SageMaker results and error matching do differently from moto's own
    (module docstring). `reported[(operation, resource name)]`: the optional members the scenario
    says the service returns for that resource; `uncaught`: (state, error) of every terminal error
    a States.ALL Retry or Catch let through. `enabled = False` gives moto's own behaviour (the
    tests that show the layer matters)."""

    # The resource a response describes: the request parameter that names it.
    NAMED_BY = {"DescribeTrainingJob": "TrainingJobName", "DescribeEndpoint": "EndpointName"}

    def __init__(self):
        self.reported = collections.defaultdict(set)
        self.uncaught = []
        self.enabled = True

    def report(self, operation, name, fields):
        self.reported[(operation, name)].update(fields)

    def response(self, operation, parameters, response):
        shape = local_sfn.SAGEMAKER_MODEL.operation_model(operation).output_shape
        if not self.enabled or shape is None:
            return response
        reported = set(self.reported[(operation, parameters.get(self.NAMED_BY.get(operation)))])
        if operation == "Search" and response.get("Results"):
            reported.add("Results")  # what matched; each record still loses its optional members
            response = dict(response, Results=[self.search_record(shape.members["Results"].member, record)
                                               for record in response["Results"]])
        return required_only(shape, response, reported)

    def search_record(self, shape, record):
        """A record keeps what the scenario reports for its training job (`JobFake.on_create`: the name and
        tags its request gave it), nothing else."""
        training_job = record.get("TrainingJob")
        kept = self.reported[("Search", training_job.get("TrainingJobName"))] if training_job else ()
        if not kept:
            return required_only(shape, record)
        return {"TrainingJob": required_only(shape.members["TrainingJob"], training_job, kept)}

    def matches_all(self, error_name, state_name):
        """False where AWS's States.ALL does not match `error_name` (recorded in `uncaught`)."""
        if self.enabled and isinstance(error_name, StatesErrorName) and error_name.typ in TERMINAL_ERRORS:
            self.uncaught.append((state_name, error_name.error_name))
            return False
        return True

    @staticmethod
    def error_name(service_name, error):
        """The documented name of an AWS SDK integration's error (module docstring)."""
        code = error.response["Error"]["Code"] if isinstance(error, ClientError) else type(error).__name__
        service = {"sagemaker": "SageMaker"}.get(service_name.lower(), service_name)
        return "%s.%s" % (service, code if code.endswith("Exception") else code + "Exception")

    @contextlib.contextmanager
    def active(self):
        aws_sdk = state_task_service_aws_sdk.StateTaskServiceAwsSdk
        decl = error_equals_decl.ErrorEqualsDecl
        original_call, original_match = aws_sdk._eval_service_task, decl._eval_body
        original_name = aws_sdk.__dict__["_normalise_exception_name"]
        layer = self

        def strict_name(norm_service_name, error):
            return layer.error_name(norm_service_name, error) if layer.enabled else original_name.__func__(
                norm_service_name, error)

        def strict_call(task, env, resource_runtime_part, normalised_parameters, state_credentials):
            sagemaker = layer.enabled and task.resource.api_name == "sagemaker"
            operation = task.resource.api_action[0].upper() + task.resource.api_action[1:]
            violations = constraint_violations(operation, normalised_parameters) if sagemaker else []
            if violations:
                raise ClientError({"Error": {"Code": "ValidationException", "Message": "%d validation error%s "
                                             "detected: %s" % (len(violations), "s" if len(violations) > 1 else "",
                                                               "; ".join(violations))},
                                   "ResponseMetadata": {"HTTPStatusCode": 400, "RequestId": "strict-layer"}},
                                  operation)
            original_call(task, env, resource_runtime_part, normalised_parameters, state_credentials)
            if sagemaker:
                env.stack.append(layer.response(operation, normalised_parameters, env.stack.pop()))

        def strict_match(component, env):
            if decl._STATE_ALL_ERROR in component.error_names and not layer.matches_all(
                    env.stack[-1], env.next_state_name):
                env.stack.pop()
                env.stack.append(False)
                return
            original_match(component, env)

        aws_sdk._eval_service_task, decl._eval_body = strict_call, strict_match
        aws_sdk._normalise_exception_name = staticmethod(strict_name)
        try:
            yield self
        finally:
            aws_sdk._eval_service_task, decl._eval_body = original_call, original_match
            aws_sdk._normalise_exception_name = original_name


class JobFake:
    """Scripts for the jobs moto's backend creates, in creation order; then `default`. A script is a list of
    steps, one per DescribeTrainingJob, or a function of the simulated seconds since the job's creation
    (`clock`: the seconds the execution's Wait states asked for so far) returning the step."""

    def __init__(self, strict=None):
        self.clock = None
        self.strict = strict or StrictLayer()
        self.scripts = []
        self.default = SUCCESS
        self.create_errors = []  # (code, message) raised by the next CreateTrainingJob calls
        self.stop_errors = []  # (code, message) raised by the next StopTrainingJob calls
        self.created = []
        self.stopped = []
        self._steps = {}
        self.endpoint_script = [("Creating", {}), ("InService", {})]
        self._endpoint_steps = {}
        self._parked = {}

    def park(self, name):
        """Hold the next DescribeTrainingJob of job `name` inside the call until `.release`.

        Returns (arrived, release): `arrived` is set once the call is held."""
        arrived, release = threading.Event(), threading.Event()
        self._parked[name] = (arrived, release)
        return arrived, release

    def on_endpoint_change(self, endpoint, status):
        self._endpoint_steps[endpoint.endpoint_name] = collections.deque(self.endpoint_script)
        endpoint.endpoint_status = status

    def on_endpoint_describe(self, endpoint):
        steps = self._endpoint_steps.get(endpoint.endpoint_name)
        if steps:
            status, extra = steps.popleft() if len(steps) > 1 else steps[0]
            endpoint.endpoint_status = status
            self.strict.report("DescribeEndpoint", endpoint.endpoint_name, extra)
            for field, value in extra.items():
                setattr(endpoint, _attribute(field), value)

    def on_create(self, training_job):
        self.created.append(training_job.training_job_name)
        self.strict.report("Search", training_job.training_job_name, ("TrainingJobName", "Tags"))
        script = self.scripts.pop(0) if self.scripts else self.default
        if callable(script):
            created = self.clock()
            self._steps[training_job.training_job_name] = lambda: script(self.clock() - created)
            self._apply(training_job, script(0))
        else:  # the first describe reports the first step too
            steps = collections.deque(script)
            self._steps[training_job.training_job_name] = lambda: steps.popleft() if len(steps) > 1 else steps[0]
            self._apply(training_job, script[0])

    def on_describe(self, training_job):
        parked = self._parked.pop(training_job.training_job_name, None)
        if parked:
            arrived, release = parked
            arrived.set()
            release.wait(60)
        step = self._steps.get(training_job.training_job_name)
        if step and training_job.training_job_name not in self.stopped:
            self._apply(training_job, step())

    def on_stop(self, training_job):
        self.stopped.append(training_job.training_job_name)
        self._apply(training_job, ("Stopped", "Stopped", {}))

    def _apply(self, training_job, step):
        status, secondary, extra = step
        self.strict.report("DescribeTrainingJob", training_job.training_job_name, extra)
        training_job.training_job_status = status
        training_job.secondary_status = secondary
        for field, value in extra.items():
            setattr(training_job, _attribute(field), value)


@pytest.fixture
def strict():
    """The `StrictLayer` of this test (module docstring); `engine` activates it."""
    return StrictLayer()


@pytest.fixture
def jobs(monkeypatch, strict):
    fake = JobFake(strict)
    backend = sagemaker_models.SageMakerModelBackend
    create, describe = backend.create_training_job, backend.describe_training_job

    def create_training_job(self, **kwargs):
        if fake.create_errors:
            code, message = fake.create_errors.pop(0)
            raise JsonRESTError(code, message)
        training_job = create(self, **kwargs)
        fake.on_create(training_job)
        return training_job

    def describe_training_job(self, training_job_name):
        if training_job_name in self.training_jobs:
            fake.on_describe(self.training_jobs[training_job_name])
        return describe(self, training_job_name)

    def stop_training_job(self):
        name = self._get_param("TrainingJobName")
        if name not in self.sagemaker_backend.training_jobs:
            raise JsonRESTError("ValidationException", "Could not find training job %s" % name)
        if fake.stop_errors:
            code, message = fake.stop_errors.pop(0)
            raise JsonRESTError(code, message)
        status = self.sagemaker_backend.training_jobs[name].training_job_status
        if status != "InProgress":  # what SageMaker answers for a job that already ended
            raise JsonRESTError("ValidationException",
                                "The request was rejected because the training job is in status %s." % status)
        fake.on_stop(self.sagemaker_backend.training_jobs[name])
        return EmptyResult()

    def update_endpoint(self):
        endpoint = self.sagemaker_backend.endpoints.get(self._get_param("EndpointName"))
        if endpoint is None:
            raise JsonRESTError("ValidationException", "Could not find endpoint %s" % self._get_param("EndpointName"))
        config = self._get_param("EndpointConfigName")
        if config not in self.sagemaker_backend.endpoint_configs:
            raise JsonRESTError("ValidationException", "Could not find endpoint configuration %s" % config)
        endpoint.endpoint_config_name = config
        fake.on_endpoint_change(endpoint, "Updating")
        return json.dumps({"EndpointArn": endpoint.arn})

    create_endpoint, describe_endpoint = backend.create_endpoint, backend.describe_endpoint

    def create_endpoint_scripted(self, **kwargs):
        endpoint = create_endpoint(self, **kwargs)
        fake.on_endpoint_change(endpoint, "Creating")
        return endpoint

    def describe_endpoint_scripted(self, endpoint_name):
        if endpoint_name in self.endpoints:
            fake.on_endpoint_describe(self.endpoints[endpoint_name])
        return describe_endpoint(self, endpoint_name)

    monkeypatch.setattr(backend, "create_endpoint", create_endpoint_scripted)
    monkeypatch.setattr(backend, "describe_endpoint", describe_endpoint_scripted)

    search = backend.search

    def search_every_filter(self, resource=None, search_expression=None):
        """moto's Search applies only the first Tags.* filter of an expression (it returns at its end);
        SageMaker applies them all (Search API reference: "all of the filters must be satisfied"): one
        search per filter, and what all of them found."""
        filters = (search_expression or {}).get("Filters")
        if not filters:
            return search(self, resource, search_expression)
        found = [search(self, resource, dict(search_expression, Filters=[one]))["Results"] for one in filters]
        result = search(self, resource, dict(search_expression, Filters=filters[:1]))
        result["Results"] = [record for record in found[0] if all(record in other for other in found[1:])]
        return result

    monkeypatch.setattr(backend, "search", search_every_filter)
    monkeypatch.setattr(backend, "create_training_job", create_training_job)
    monkeypatch.setattr(backend, "describe_training_job", describe_training_job)
    monkeypatch.setattr(sagemaker_responses.SageMakerResponse, "stop_training_job", stop_training_job, raising=False)
    monkeypatch.setattr(sagemaker_responses.SageMakerResponse, "update_endpoint", update_endpoint, raising=False)
    return fake


class Deployment:
    """A mocked account with the resources the definitions point at, and helpers to run them."""

    def __init__(self, settings, jobs, directory, prepared=None):
        """`prepared`: the data directories earlier executions prepared (default: the settings' dataset
        directory; `()` for a fresh account whose file system holds only its root); `directory`: where the
        gate's code is staged."""
        self.settings = settings
        self.jobs = jobs
        # The account's SageMaker quotas as Service Quotas answers the gate: ample, unless a test says otherwise.
        self.quotas(quota_tables.account())
        self.gate = local_lambda.create_gate(_SESSION.client("iam"), _SESSION.client("lambda"), settings,
                                             staged_gate(directory))
        self.sfn = _SESSION.client("stepfunctions")
        self.sagemaker = _SESSION.client("sagemaker")
        sns = _SESSION.client("sns")
        sqs = _SESSION.client("sqs")
        self.topic = sns.create_topic(Name="lmstack-events")["TopicArn"]
        self.queue = sqs.create_queue(QueueName="notifications")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=self.topic, Protocol="sqs", Endpoint=queue_arn,
                      Attributes={"RawMessageDelivery": "true"})
        self.sqs = sqs
        self.values = local_sfn.stand_in_values(settings, self.topic, self.gate)
        self.machine = self._create("lmstack-training", build_training_definition(settings))
        self.stop_machine = self._create("lmstack-stop", build_stop_definition(settings))
        self.file_system = aws_rules.FileSystem(self.values["FileSystemId"])
        # What the stack's execution role may read (stacks.iam: the prefixes jobs write, which an evaluation job's
        # model channel reads, the read-only prefixes, raw_data_prefixes).
        self.readable_prefixes = tuple("s3://%s/%s" % (self.values["ArtifactBucket"], prefix) for prefix in (
            bucket_layout.ARTIFACT_PREFIXES + bucket_layout.READ_ONLY_PREFIXES)) + tuple(settings.raw_data_prefixes)
        for index, directory in enumerate((settings.dataset_directory,) if prepared is None else prepared):
            self.record_prepared(directory, "lmstack-prep-earlier-%d" % index)

    def record_prepared(self, directory, name, file_system_id=None):
        """What a completed prepare job of an earlier execution leaves: its record in SageMaker, which the
        Prepare stage's dataset check finds, and the directory on the file system (`file_system_id`: of
        another stack's file system, which this one's does not get)."""
        self.jobs.scripts.insert(0, [("Completed", "Completed", {})])
        values = self.values if file_system_id is None else dict(self.values, FileSystemId=file_system_id)
        local_sfn.record_prepared_dataset(self.sagemaker, self.settings, values, directory, name)
        self.jobs.created.remove(name)
        if file_system_id is None:
            self.file_system.make(directory)

    def quotas(self, table):
        """What Service Quotas answers the gate's function from now on (`lmstack.local_service_quotas`, or None:
        nothing answers, as without network)."""
        local_lambda.RUNTIME.service_quotas = table

    def _create(self, name, definition):
        return self.sfn.create_state_machine(name=name, definition=render(definition, self.values),
                                             roleArn=ROLE)["stateMachineArn"]

    def start(self, execution_input, name="run-1", machine=None):
        return self.sfn.start_execution(stateMachineArn=machine or self.machine, name=name,
                                        input=json.dumps(execution_input))["executionArn"]

    def wait(self, execution_arn, timeout=60):
        local_sfn.wait_for_end(execution_arn, timeout)
        return self.sfn.describe_execution(executionArn=execution_arn)

    def run(self, execution_input, name="run-1", machine=None):
        execution = self.start(execution_input, name, machine)
        run = Run(self, execution, self.wait(execution))
        if machine is None:
            run.assert_the_gate_ran()
        return run

    def history(self, execution_arn):
        return local_sfn.history(execution_arn)

    def existing_endpoint(self, endpoint="lmstack-gpt", config="lmstack-old"):
        """An endpoint an earlier deployment left, serving `config` (model of the same name)."""
        self.sagemaker.create_model(ModelName=config, ExecutionRoleArn=self.values["ExecutionRoleArn"],
                                    PrimaryContainer={"Image": "image", "ModelDataUrl": "s3://%s/old.tar.gz"
                                                      % self.values["ArtifactBucket"]})
        self.sagemaker.create_endpoint_config(EndpointConfigName=config, ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": config, "InstanceType": "ml.g4dn.12xlarge",
            "InitialInstanceCount": 1}])
        self.sagemaker.create_endpoint(EndpointName=endpoint, EndpointConfigName=config)

    def notifications(self):
        messages = []
        while True:
            batch = self.sqs.receive_message(QueueUrl=self.queue, MaxNumberOfMessages=10).get("Messages", [])
            if not batch:
                return messages
            messages.extend(message["Body"] for message in batch)


class Run:
    def __init__(self, deployment, arn, description):
        self.deployment = deployment
        self.arn = arn
        self.description = description
        self.events = deployment.history(arn)

    @property
    def status(self):
        return self.description["status"]

    @property
    def output(self):
        return json.loads(self.description["output"])

    def calls(self, action=None):
        """(resource type, action, parameters) of every task the execution scheduled."""
        return local_sfn.scheduled_calls(self.events, action)

    def states_entered(self):
        return local_sfn.states_entered(self.events)

    def gate_invocations(self, bills=False):
        """The gate's invocations of this execution that decide a run (`bills`: those that compute its bill,
        `controlplane.bill`), in order (`lmstack.local_lambda`'s records)."""
        name = self.arn.rsplit(":", 1)[-1]
        return [invocation for invocation in local_lambda.RUNTIME.invocations
                if invocation.function_arn == self.deployment.gate and invocation.event.get("execution_name") == name
                and ("bill" in invocation.event) == bills]

    def gate_answers(self):
        """What the gate's handler answered this execution, in order."""
        return [invocation.payload for invocation in self.gate_invocations()]

    def assert_the_gate_ran(self):
        """The Validate state's answer came from the gate's handler, run from its staged code (moto's Lambda
        alone echoes the payload, and a Choice on a missing field takes its default)."""
        exits = [json.loads(event["stateExitedEventDetails"]["output"]) for event in self.events
                 if event.get("stateExitedEventDetails", {}).get("name") == "Validate"]
        decided = [output for output in exits if "answer" in output]  # not a caught error of the function
        if decided:
            answers = self.gate_answers()
            assert answers and answers[0] == decided[0]["answer"], (answers[:1], decided)


def invalid_sagemaker_requests(run):
    """botocore's own parameter validation of every SageMaker request the execution made, then the strict
    request rules of tests/aws_rules.py (the API reference's maximums and patterns, Profiler off, EFS
    directories that exist on the deployment's file system when each job starts, S3 inputs the execution
    role may read)."""
    return local_sfn.invalid_sagemaker_requests(run.calls()) + aws_rules.check_requests(
        run.calls(), run.deployment.file_system, run.deployment.readable_prefixes)


@functools.lru_cache(maxsize=None)
def _json_path(path):
    """jsonpath_ng's parse, once per path: it builds a new PLY parser on every call, most of an
    execution's evaluation time. A parsed expression is immutable and its `find` pure."""
    return jsonpath_ng.ext.parse(path)


@functools.lru_cache(maxsize=None)
def _result_path(path):
    return jsonpath_ng.parse(path)


@pytest.fixture
def retry_waits(monkeypatch):
    """The seconds every Retry of the test's executions waited before its next attempt (not slept)."""
    asked = []
    monkeypatch.setattr(retrier_decl, "time", types.SimpleNamespace(sleep=asked.append))
    return asked


@pytest.fixture
def sdk_retries_at_once(monkeypatch):
    """botocore's retries in this process sent without the backoff it sleeps first (`botocore.endpoint`'s only use
    of `time`; up to a second a call in standard mode): the stand-ins of `quota_tables` and `price_lists` answer or
    fail at once, so the wait would only delay the same attempts and answer (as in `lmstack.local_lambda`'s worker)."""
    monkeypatch.setattr(botocore.endpoint, "time", types.SimpleNamespace(sleep=lambda seconds: None))


def staged_gate(directory):
    """The gate's code as `cdk synth` stages it (`stacks.gate_code.stage`), with this process's edited sources."""
    code = gate_code.stage(directory)
    for source, text in EDITED_SOURCES.items():
        target = gate_code.code_path(source)
        if target is not None:
            (code / target).parent.mkdir(parents=True, exist_ok=True)
            (code / target).write_text(text)
    return code


@pytest.fixture
def engine(strict, monkeypatch, retry_waits):
    """moto's Step Functions engine (fast), with the strict layer and the gate's function running its code."""
    monkeypatch.setattr(json_path, "parse", _json_path)
    monkeypatch.setattr(result_path, "parse", _result_path)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}), local_sfn.fast_engine() as asked, \
            strict.active(), local_lambda.local_lambda():
        yield asked


@pytest.fixture
def waits(engine):
    """The seconds every Wait state of the test's executions asked for."""
    return engine


@pytest.fixture
def make_deployment(engine, jobs, tmp_path_factory):
    return lambda settings=None, prepared=None: Deployment(settings or StandInSettings(), jobs,
                                                           tmp_path_factory.mktemp("gate"), prepared)


@pytest.fixture
def deployment(make_deployment):
    return make_deployment()
