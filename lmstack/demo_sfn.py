"""Demo step: execute the shipped training state machine on moto's Step Functions engine and
take the CreateTrainingJob requests it made (the training job's, the evaluation job's), which then drive the
local training and evaluation runs.

The definition is `stacks.state_machine.build_training_definition`, the document the CDK app
deploys; its `${...}` placeholders get the demo's stand-in values (no AWS resource exists).
It runs on `lmstack.local_sfn.fast_engine` (moto's engine, its parse kept and its waits
shortened); the gate's Lambda function runs its staged code (`lmstack.local_lambda`). moto stores a created training job as `Completed` at once, so the execution goes
straight through its monitor loop. Every SageMaker request is checked with botocore's own
parameter validation (moto does not validate).
"""
import json
import tempfile
import time

import boto3

from controlplane import request
from lmstack import local_lambda, local_sfn
from lmstack.demo_run import POLL_SECONDS, StepError, bar

EXECUTION_NAME = "demo"
TIMEOUT_SECONDS = 300


def execute(settings, execution_input):
    """Run one execution; {"states", "request", "output"}; StepError
    naming the error and cause when it does not succeed."""
    from moto import mock_aws

    from stacks.state_machine import build_training_definition, render

    definition = build_training_definition(settings)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}), local_sfn.fast_engine(), \
            local_lambda.local_lambda() as lambdas, tempfile.TemporaryDirectory() as scratch:
        sfn = boto3.client("stepfunctions", region_name=local_sfn.REGION)
        topic = boto3.client("sns", region_name=local_sfn.REGION).create_topic(Name="%s-events" % settings.name_prefix)
        gate = local_lambda.deploy_gate(boto3.client("iam", region_name=local_sfn.REGION),
                                        boto3.client("lambda", region_name=local_sfn.REGION), settings, scratch)
        try:
            values = local_sfn.stand_in_values(settings, topic["TopicArn"], gate)
        except ValueError as error:
            raise StepError(str(error))
        # The dataset lm.data.prepare made on this machine stands for a prepare job of an earlier execution:
        # the machine refuses to train on a data directory no completed prepare job made.
        local_sfn.record_prepared_dataset(boto3.client("sagemaker", region_name=local_sfn.REGION), settings, values,
                                          execution_input["data_directory"], "%s-prep-local" % settings.name_prefix)
        document = render(definition, values)
        with bar("parsing the definition (%d states) on moto's engine" % len(definition["States"])) as progress:
            machine = sfn.create_state_machine(
                name="%s-training" % settings.name_prefix, definition=document,
                roleArn="arn:aws:iam::%s:role/%s-states" % (local_sfn.ACCOUNT, settings.name_prefix))["stateMachineArn"]
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
        events = local_sfn.history(execution)
        gate_ran = any(invocation.function_arn == gate for invocation in lambdas.invocations)
    states = local_sfn.states_entered(events)
    if not gate_ran:
        raise StepError("the gate's function never ran (moto's Lambda without the local runtime)")
    if description["status"] != "SUCCEEDED":
        raise StepError("the execution ended %s: %s: %s (last states: %s)" % (
            description["status"], description.get("error"), description.get("cause"), ", ".join(states[-5:])))
    calls = local_sfn.scheduled_calls(events)
    problems = local_sfn.invalid_sagemaker_requests(calls)
    if problems:
        raise StepError("a request is invalid for the SageMaker API: %s" % "; ".join(problems))
    requests = {}
    for _, action, parameters in calls:
        if action == "createTrainingJob":
            kind = next(tag["Value"] for tag in parameters["Tags"] if tag["Key"] == request.KIND_TAG)
            requests.setdefault(kind, []).append(parameters)
    if len(requests.get("train", ())) != 1 or len(requests.get("evaluate", ())) > 1:
        raise StepError("expected one training job and at most one evaluation job, the execution made %s" % (
            ", ".join("%d %s" % (len(made), kind) for kind, made in sorted(requests.items()))))
    return {"states": states, "request": requests["train"][0], "evaluation_request": requests.get("evaluate", [None])[0],
            "output": json.loads(description["output"])}
