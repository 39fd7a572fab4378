"""Run the shipped state machine definitions on moto's Step Functions engine, and read back
what an execution did. `make demo` (lmstack.demo_sfn) and the state machine tests use it.

The gate's Lambda function runs its own code here (`lmstack.local_lambda`: moto's Lambda does not run
code). `fast_engine` bridges two things of moto's engine, both for speed only:
- its ASL parser (ANTLR in pure Python, seconds for the training definition, more on a busy
  machine) and the Preprocessor that builds the evaluation components from the syntax tree
  (about 0.8 s for the training definition) run on create and again on every execution: the
  program of each definition text is built once for the process and shared by its executions.
  moto shares programs the same way: a Map state runs one iteration program in all its
  concurrent workers (inline_iteration_component.py, `_eval_body`), because the components keep
  no execution state; that lives in each execution's Environment;
- Wait states sleep for real: they wait WAIT_SECONDS (10 ms) instead, and the seconds asked for are kept;
- every Task state builds a new boto3 client for its service (`boto_client_for`: a client class and its
  methods made afresh, about a third of an aws-sdk task's time): one client per region and service is
  made and kept, with the same configuration (clients are safe to share between threads);
- the end of an execution is told (`wait_for_end`), so a caller need not poll DescribeExecution: each
  poll runs moto's response serializer while the execution's thread waits for the GIL.

`history` reads an execution's events from moto's engine, not through GetExecutionHistory: moto's
serializer and botocore's parser took about 0.3 s an execution and changed nothing but the types of
`type` and `timestamp`, which `history` gives as the API does.

moto does not validate request parameters: `invalid_sagemaker_requests` runs botocore's own
validation against the SageMaker service model on every SageMaker call an execution made.
"""
import contextlib
import datetime
import json
import threading
import weakref

import botocore.session
import botocore.validate

ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"
_PROGRAMS = {}  # definition text -> (program, syntax tree), moto's parse result
WAIT_SECONDS = 0.01  # what a Wait state waits for real under fast_engine, whatever it asks


def stand_in_values(settings, topic_arn, gate_arn):
    """A value for every `${...}` placeholder of the training definition: stand-ins for the
    resources the CDK app creates (no AWS resource exists but the topic and the gate's function,
    `lmstack.local_lambda.deploy_gate`); ValueError naming any missed."""
    from stacks.state_machine import training_substitutions

    prefix = settings.name_prefix
    values = {
        "ExecutionRoleArn": "arn:aws:iam::%s:role/%s-sagemaker" % (ACCOUNT, prefix),
        "ArtifactBucket": "%s-artifacts" % prefix,
        "FileSystemId": "fs-0123456789abcdef0",
        "SecurityGroupId": "sg-0123456789abcdef0",
        "EndpointRoleArn": "arn:aws:iam::%s:role/%s-endpoint" % (ACCOUNT, prefix),
        "HostingSecurityGroupId": "sg-0123456789abcdef1",
        "TopicArn": topic_arn,
        "GateFunctionArn": gate_arn,
    }
    for index in range(settings.subnet_count):
        values["Subnet%d" % index] = "subnet-0%015d" % index
    for runtime in settings.runtimes:
        values["Image_%s" % runtime] = "%s.dkr.ecr.%s.amazonaws.com/%s:%s" % (ACCOUNT, REGION, prefix, runtime)
    missing = sorted(set(training_substitutions(settings)) - set(values))
    if missing:
        raise ValueError("the definition has placeholders with no stand-in value: %s" % ", ".join(missing))
    return values


def record_prepared_dataset(sagemaker, settings, values, data_directory, job_name):
    """Create in moto's SageMaker (which stores a new job as Completed) the prepare job an earlier
    execution would have left for `data_directory`, with the default raw source and settings: the
    state machine's check that a training run's dataset was prepared finds it by its tags. The request is the builder's own
    (`controlplane.request`), its placeholders filled with `values`."""
    from controlplane import inputs, request
    from stacks.state_machine import jobs, render, training

    config = inputs.with_defaults(inputs.schema(settings), {"data_directory": data_directory})
    prepare = jobs.concrete_values(jobs.PREPARE, settings, config, job_name=job_name, execution_name=job_name,
                                   dataset_key=training.concrete_dataset_key(config))
    sagemaker.create_training_job(**json.loads(render(request.create_training_job_request(prepare), values)))


_CLIENTS = {}  # (region, service, intercepted by moto) -> the client moto's boto_client_for made
_ENDED = threading.Condition()  # notified whenever an execution ends
_ENDED_EXECUTIONS = weakref.WeakSet()  # moto's Execution objects whose end is recorded (status, output)


@contextlib.contextmanager
def fast_engine():
    """Patch moto's engine as described above; yields the list of seconds Wait states asked for."""
    import sys

    from moto.core.models import botocore_stubber
    from moto.stepfunctions.parser.backend.execution import BaseExecutionWorkerCommunication
    from moto.stepfunctions.parser.asl.component.state.wait.wait_function import wait_function
    from moto.stepfunctions.parser.asl.parse import asl_parser
    # imports every service module that calls boto_client_for
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service_factory  # noqa: F401
    from moto.stepfunctions.parser.asl.utils import boto_client

    parser = asl_parser.AmazonStateLanguageParser
    original_parse = parser.__dict__["parse"]
    original_wait = wait_function.WaitFunction._wait_interval
    asked = []

    def parse_once(definition):
        if definition not in _PROGRAMS:
            _PROGRAMS[definition] = original_parse.__func__(definition)
        return _PROGRAMS[definition]

    def short_wait(self, env, wait_seconds):
        asked.append(wait_seconds)
        env.program_state_event.wait(WAIT_SECONDS)

    original_terminated = BaseExecutionWorkerCommunication.terminated

    def terminated_and_told(communication):
        original_terminated(communication)
        with _ENDED:
            _ENDED_EXECUTIONS.add(communication.execution)
            _ENDED.notify_all()

    make_client = boto_client.boto_client_for

    def client_once(region, service, state_credentials=None):
        key = (region, service, botocore_stubber.enabled, repr(state_credentials))
        if key not in _CLIENTS:
            _CLIENTS[key] = make_client(region, service, state_credentials)
        return _CLIENTS[key]

    # Every module of the engine that imported the function by name.
    users = [module for name, module in list(sys.modules.items())
             if name.startswith("moto.stepfunctions.parser") and getattr(module, "boto_client_for", None) is make_client]
    parser.parse = staticmethod(parse_once)
    wait_function.WaitFunction._wait_interval = short_wait
    BaseExecutionWorkerCommunication.terminated = terminated_and_told
    for module in users:
        module.boto_client_for = client_once
    try:
        yield asked
    finally:
        parser.parse = original_parse
        wait_function.WaitFunction._wait_interval = original_wait
        BaseExecutionWorkerCommunication.terminated = original_terminated
        for module in users:
            module.boto_client_for = make_client


def _execution(execution_arn):
    """moto's Execution object of `execution_arn` (in the account and region the ARN names)."""
    from moto.stepfunctions.parser.models import stepfunctions_parser_backends

    region, account = execution_arn.split(":")[3:5]
    return stepfunctions_parser_backends[account][region].describe_execution(execution_arn)


def wait_for_end(execution_arn, timeout):
    """Block until the execution has ended under `fast_engine`, or `timeout` seconds passed; whether it ended."""
    execution = _execution(execution_arn)
    with _ENDED:
        return _ENDED.wait_for(lambda: execution in _ENDED_EXECUTIONS, timeout)


def history(execution_arn):
    """The execution's events as GetExecutionHistory returns them (module docstring)."""
    return [dict(event, type=event["type"].value, timestamp=datetime.datetime.fromisoformat(event["timestamp"]))
            for event in _execution(execution_arn).to_history_output()["events"]]


def states_entered(events):
    return [event["stateEnteredEventDetails"]["name"] for event in events if "stateEnteredEventDetails" in event]


def scheduled_calls(events, action=None):
    """(resource type, action, parameters) of every task the execution scheduled, in order."""
    found = []
    for event in events:
        details = event.get("taskScheduledEventDetails")
        if details:
            name = details["resource"].split(":")[-1]
            if action is None or name == action:
                found.append((details["resourceType"], name, json.loads(details["parameters"])))
    return found


# botocore's SageMaker service model, read once for the process (the tests read it from here too):
# each new botocore session decompresses and parses its 2.5 MB again.
SAGEMAKER_MODEL = botocore.session.get_session().get_service_model("sagemaker")


def invalid_sagemaker_requests(calls):
    """botocore's validation report of each SageMaker call in `calls` that it rejects."""
    problems = []
    validator = botocore.validate.ParamValidator()
    for resource_type, action, parameters in calls:
        if "sagemaker" not in resource_type:
            continue
        operation = action[0].upper() + action[1:]
        report = validator.validate(parameters, SAGEMAKER_MODEL.operation_model(operation).input_shape)
        if report.has_errors():
            problems.append("%s: %s" % (operation, report.generate_report()))
    return problems
