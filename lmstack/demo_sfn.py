"""Demo step: execute the shipped training state machine on moto's Step Functions engine and
take the CreateTrainingJob request it made, which then drives the local training run.

The definition is `stacks.state_machine.build_training_definition`, the document the CDK app
deploys; its `${...}` placeholders get the demo's stand-in values (no AWS resource exists).
Two things of moto's engine are bridged, both for speed only:
- its ASL parser (ANTLR in pure Python, ~15 s for this definition) runs on create and again
  on every execution: the parse of one definition text is kept and reused;
- Wait states sleep for real: they wait 10 ms instead.
moto stores a created training job as `Completed` at once, so the execution goes straight
through its monitor loop. The request is checked with botocore's own parameter validation
against the SageMaker service model (moto does not validate).
"""
import contextlib
import json
import time

import boto3
import botocore.session
import botocore.validate

from lmstack.demo_run import POLL_SECONDS, StepError, bar

ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"
EXECUTION_NAME = "demo"
TIMEOUT_SECONDS = 300


def stand_in_values(settings, topic_arn):
    """A value for every placeholder of the definition: demo resources, not real ones."""
    from stacks.state_machine import training_substitutions

    values = {
        "ExecutionRoleArn": "arn:aws:iam::%s:role/%s-sagemaker" % (ACCOUNT, settings.name_prefix),
        "ArtifactBucket": "%s-demo-artifacts" % settings.name_prefix,
        "FileSystemId": "fs-0123456789abcdef0",
        "SecurityGroupId": "sg-0123456789abcdef0",
        "TopicArn": topic_arn,
        "DebuggerRuleImage": "sagemaker-debugger-rules:latest",
    }
    for index in range(settings.az_count):
        values["Subnet%d" % index] = "subnet-0%015d" % index
    for runtime in settings.runtimes:
        values["Image_%s" % runtime] = "%s:%s" % (settings.name_prefix, runtime)
    missing = sorted(set(training_substitutions(settings)) - set(values))
    if missing:
        raise StepError("the definition has placeholders the demo has no value for: %s" % ", ".join(missing))
    return values


@contextlib.contextmanager
def fast_engine():
    """moto's engine with the parse kept per definition text and 10 ms waits (see above)."""
    from moto.stepfunctions.parser.asl.component.state.wait.wait_function import wait_function
    from moto.stepfunctions.parser.asl.parse import asl_parser

    parser = asl_parser.AmazonStateLanguageParser
    original_parse = parser.__dict__["parse"]
    original_wait = wait_function.WaitFunction._wait_interval
    parsed = {}

    def parse_once(definition):
        if definition not in parsed:
            parsed[definition] = original_parse.__func__(definition)
        return parsed[definition]

    def short_wait(self, env, wait_seconds):
        env.program_state_event.wait(0.01)

    parser.parse = staticmethod(parse_once)
    wait_function.WaitFunction._wait_interval = short_wait
    try:
        yield
    finally:
        parser.parse = original_parse
        wait_function.WaitFunction._wait_interval = original_wait


def _history(sfn, execution_arn):
    events, token = [], None
    while True:
        page = sfn.get_execution_history(executionArn=execution_arn, maxResults=1000,
                                         **({"nextToken": token} if token else {}))
        events.extend(page["events"])
        token = page.get("nextToken")
        if not token:
            return events


def states_entered(events):
    return [event["stateEnteredEventDetails"]["name"] for event in events if "stateEnteredEventDetails" in event]


def training_requests(events):
    """The parameters of every CreateTrainingJob task the execution scheduled."""
    return [json.loads(event["taskScheduledEventDetails"]["parameters"]) for event in events
            if event.get("taskScheduledEventDetails", {}).get("resource", "").endswith("createTrainingJob")]


def invalid_fields(request):
    """botocore's validation report of a CreateTrainingJob request ('' when valid)."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    report = botocore.validate.ParamValidator().validate(
        request, model.operation_model("CreateTrainingJob").input_shape)
    return report.generate_report() if report.has_errors() else ""


def execute(settings, execution_input):
    """Run one execution; {"states", "request", "output"}; StepError
    naming the error and cause when it does not succeed."""
    from moto import mock_aws

    from stacks.state_machine import build_training_definition, render

    definition = build_training_definition(settings)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}), fast_engine():
        sfn = boto3.client("stepfunctions", region_name=REGION)
        topic = boto3.client("sns", region_name=REGION).create_topic(Name="%s-events" % settings.name_prefix)
        document = render(definition, stand_in_values(settings, topic["TopicArn"]))
        with bar("parsing the definition (%d states) on moto's engine" % len(definition["States"])) as progress:
            machine = sfn.create_state_machine(
                name="%s-training" % settings.name_prefix, definition=document,
                roleArn="arn:aws:iam::%s:role/%s-states" % (ACCOUNT, settings.name_prefix))["stateMachineArn"]
            progress.refresh()
        execution = sfn.start_execution(stateMachineArn=machine, name=EXECUTION_NAME,
                                        input=json.dumps(execution_input))["executionArn"]
        deadline = time.monotonic() + TIMEOUT_SECONDS
        with bar("executing", total=None, unit="state") as progress:
            while True:
                description = sfn.describe_execution(executionArn=execution)
                progress.set_postfix_str(description["status"])
                if description["status"] != "RUNNING":
                    break
                if time.monotonic() > deadline:
                    raise StepError("the execution still runs after %d s" % TIMEOUT_SECONDS)
                time.sleep(POLL_SECONDS)
        events = _history(sfn, execution)
    states = states_entered(events)
    if description["status"] != "SUCCEEDED":
        raise StepError("the execution ended %s: %s: %s (last states: %s)" % (
            description["status"], description.get("error"), description.get("cause"), ", ".join(states[-5:])))
    requests = training_requests(events)
    if len(requests) != 1:
        raise StepError("expected one CreateTrainingJob request, the execution made %d" % len(requests))
    problems = invalid_fields(requests[0])
    if problems:
        raise StepError("the CreateTrainingJob request is invalid for the SageMaker API: %s" % problems)
    return {"states": states, "request": requests[0], "output": json.loads(description["output"])}
