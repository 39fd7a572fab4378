"""Run the shipped definitions on moto's Step Functions engine, SageMaker and SNS mocked.

The engine is `lmstack.local_sfn.fast_engine` (its parse kept, its waits shortened to 10 ms
with the seconds asked for recorded), the one the demo uses. moto's SageMaker differs from
AWS in ways these tests must bridge, each by a fake that does only what the AWS API
reference documents for that call:
- a training job is stored `Completed` at once: `JobFake` moves each new job through a
  script of (TrainingJobStatus, SecondaryStatus, extra describe fields), one step per
  DescribeTrainingJob, by setting the attributes moto's job object renders;
- StopTrainingJob and UpdateEndpoint are missing: added as response handlers;
- an endpoint is `InService` at once: each created or updated endpoint follows
  `endpoint_script` instead, one step per DescribeEndpoint;
- moto's engine loses its place when an execution is stopped between the steps of a Task
  state (it skips the stopped steps but still pops their results, and fails the execution
  with States.Runtime instead of aborting it): `JobFake.park` holds a job's next
  DescribeTrainingJob inside the call, so a test can stop the execution there, race-free.
"""
import collections
import dataclasses
import json
import threading
import time
from typing import Tuple

import boto3
import pytest
from moto import mock_aws
from moto.core.exceptions import JsonRESTError
from moto.core.responses import EmptyResult
from moto.sagemaker import models as sagemaker_models
from moto.sagemaker import responses as sagemaker_responses

import aws_rules
from lm import job
from lmstack import local_sfn
from lmstack.local_sfn import ACCOUNT, REGION
from stacks.state_machine import build_stop_definition, build_training_definition, render

ROLE = "arn:aws:iam::%s:role/sfn" % ACCOUNT
EXECUTION_ROLE = "arn:aws:iam::%s:role/lmstack-sagemaker" % ACCOUNT


@dataclasses.dataclass(frozen=True)
class StandInSettings:
    """The attributes of `stacks.config.Settings` the definitions may read, nothing else."""
    name_prefix: str = "lmstack"
    region: str = REGION
    az_count: int = 2
    runtimes: Tuple[str, ...] = tuple(job.RUNTIMES)
    default_preset: str = "tiny"
    default_strategy: str = "single"
    default_instance_type: str = "ml.g5.2xlarge"
    default_instance_count: int = 1
    default_max_runtime_seconds: int = 3600
    spot: bool = False
    dataset_directory: str = "/datasets/sample"


COMPLETED_EXTRA = {"BillableTimeInSeconds": 1234, "TrainingTimeInSeconds": 1300,
                   "FinalMetricDataList": [{"MetricName": "train:loss", "Value": 3.1},
                                           {"MetricName": "validation:loss", "Value": 3.3}]}
SUCCESS = [("InProgress", "Starting", {}), ("InProgress", "Downloading", {}), ("InProgress", "Training", {}),
           ("InProgress", "Training", {}), ("InProgress", "Training", {}), ("InProgress", "Uploading", {}),
           ("Completed", "Completed", COMPLETED_EXTRA)]


def _attribute(field):
    return "".join("_" + char.lower() if char.isupper() else char for char in field).lstrip("_")


class JobFake:
    """Scripts for the jobs moto's backend creates, in creation order; then `default`."""

    def __init__(self):
        self.scripts = []
        self.default = SUCCESS
        self.create_errors = []  # (code, message) raised by the next CreateTrainingJob calls
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
            for field, value in extra.items():
                setattr(endpoint, _attribute(field), value)

    def on_create(self, training_job):
        self.created.append(training_job.training_job_name)
        script = self.scripts.pop(0) if self.scripts else self.default
        self._steps[training_job.training_job_name] = collections.deque(script)
        self._apply(training_job, script[0])

    def on_describe(self, training_job):
        parked = self._parked.pop(training_job.training_job_name, None)
        if parked:
            arrived, release = parked
            arrived.set()
            release.wait(60)
        steps = self._steps.get(training_job.training_job_name)
        if steps and training_job.training_job_name not in self.stopped:
            self._apply(training_job, steps.popleft() if len(steps) > 1 else steps[0])

    def on_stop(self, training_job):
        self.stopped.append(training_job.training_job_name)
        self._apply(training_job, ("Stopped", "Stopped", {}))

    @staticmethod
    def _apply(training_job, step):
        status, secondary, extra = step
        training_job.training_job_status = status
        training_job.secondary_status = secondary
        for field, value in extra.items():
            setattr(training_job, _attribute(field), value)


@pytest.fixture
def jobs(monkeypatch):
    fake = JobFake()
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

    monkeypatch.setattr(backend, "create_training_job", create_training_job)
    monkeypatch.setattr(backend, "describe_training_job", describe_training_job)
    monkeypatch.setattr(sagemaker_responses.SageMakerResponse, "stop_training_job", stop_training_job, raising=False)
    monkeypatch.setattr(sagemaker_responses.SageMakerResponse, "update_endpoint", update_endpoint, raising=False)
    return fake


class Deployment:
    """A mocked account with the resources the definitions point at, and helpers to run them."""

    def __init__(self, settings, jobs):
        self.settings = settings
        self.jobs = jobs
        self.sfn = boto3.client("stepfunctions", region_name=REGION)
        self.sagemaker = boto3.client("sagemaker", region_name=REGION)
        sns = boto3.client("sns", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        self.topic = sns.create_topic(Name="lmstack-events")["TopicArn"]
        self.queue = sqs.create_queue(QueueName="notifications")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=self.topic, Protocol="sqs", Endpoint=queue_arn,
                      Attributes={"RawMessageDelivery": "true"})
        self.sqs = sqs
        self.values = local_sfn.stand_in_values(settings, self.topic)
        self.machine = self._create("lmstack-training", build_training_definition(settings))
        self.stop_machine = self._create("lmstack-stop", build_stop_definition(settings))

    def _create(self, name, definition):
        return self.sfn.create_state_machine(name=name, definition=render(definition, self.values),
                                             roleArn=ROLE)["stateMachineArn"]

    def start(self, execution_input, name="run-1", machine=None):
        return self.sfn.start_execution(stateMachineArn=machine or self.machine, name=name,
                                        input=json.dumps(execution_input))["executionArn"]

    def wait(self, execution_arn, timeout=60):
        deadline = time.time() + timeout
        while True:
            description = self.sfn.describe_execution(executionArn=execution_arn)
            if description["status"] != "RUNNING" or time.time() > deadline:
                return description
            time.sleep(0.05)

    def run(self, execution_input, name="run-1", machine=None):
        execution = self.start(execution_input, name, machine)
        return Run(self, execution, self.wait(execution))

    def history(self, execution_arn):
        return local_sfn.history(self.sfn, execution_arn)

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


def invalid_sagemaker_requests(run):
    """botocore's own parameter validation of every SageMaker request the execution made, then the strict
    request rules of tests/aws_rules.py (the API reference's maximums and patterns, Profiler off)."""
    return local_sfn.invalid_sagemaker_requests(run.calls()) + aws_rules.check_requests(run.calls())


@pytest.fixture
def engine():
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}), local_sfn.fast_engine() as asked:
        yield asked


@pytest.fixture
def waits(engine):
    """The seconds every Wait state of the test's executions asked for."""
    return engine


@pytest.fixture
def make_deployment(engine, jobs):
    return lambda settings=None: Deployment(settings or StandInSettings(), jobs)


@pytest.fixture
def deployment(make_deployment):
    return make_deployment()
