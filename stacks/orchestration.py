"""Orchestration: the training state machine, the stop-on-abort machine and the rule that links them.

Both definitions come from `stacks.state_machine` as plain JSON (the tests execute the very
document we ship). Each is deployed as a file asset (DefinitionS3Location), not inline: the
training definition alone is most of a megabyte, and CloudFormation's template limit (1,000,000
bytes from S3) counts it with every other resource and its quotes escaped, while Step Functions'
own limit (1,048,576 bytes) counts the definition alone. CloudFormation reads the object and fills
its `${Name}` placeholders from `definition_substitutions` before CreateStateMachine, as it does an
inline one (the resource provider's DefinitionProcessor). tests/cdk read the staged files back into
the template, so cfn-lint and asl-validator check what CloudFormation creates.
"""
import pathlib
from typing import Mapping

import aws_cdk as cdk

from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from stacks import state_machine
from stacks.state_machine.names import placeholders
from stacks.common import log_group
from stacks.settings import Settings
from stacks.nag import acknowledge

# A failed execution can also leave a job running (e.g. a describe call that kept failing).
STOP_ON = ("ABORTED", "TIMED_OUT", "FAILED")
# Step Functions' own log delivery and X-Ray calls, added by the CDK for `logs` and `tracing_enabled`.
SERVICE_WILDCARD_REASON = (
    "Added by the CDK for the state machine's logging and X-Ray tracing: CloudWatch Logs log-delivery "
    "actions (CreateLogDelivery, PutResourcePolicy, DescribeLogGroups, ...) and xray:PutTraceSegments / "
    "PutTelemetryRecords / GetSamplingRules / GetSamplingTargets have no resource-level permissions.")

# Step Functions Developer Guide, "Avoiding Amazon CloudWatch Logs resource policy size restrictions":
# log groups under /aws/vendedlogs/ keep the account's CloudWatch Logs resource policy under its 5120 characters.
STATE_MACHINE_LOG_PREFIX = "/aws/vendedlogs/states/"


class Orchestration(Construct):
    """The Standard training machine, the stop machine and the EventBridge rule (aborted, timed out, failed -> stop)."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, values: Mapping[str, str],
                 training_role: iam.IRole, stop_role: iam.IRole, log_key: kms.IKey) -> None:
        super().__init__(scope, construct_id)
        self._log_key = log_key
        self.training_definition = state_machine.build_training_definition(settings)
        self.stop_definition = state_machine.build_stop_definition(settings)
        self.training_machine = self._machine(
            "TrainingMachine", settings.name_prefix + "-training", self.training_definition,
            _pick(values, self.training_definition, state_machine.training_substitutions(settings), "training"),
            training_role, settings)
        self.stop_machine = self._machine(
            "StopMachine", settings.name_prefix + "-stop-on-abort", self.stop_definition,
            _pick(values, self.stop_definition, state_machine.stop_substitutions(settings), "stop-on-abort"),
            stop_role, settings)
        self.stop_rule = events.Rule(
            self, "StopOnAbort",
            description="Stop the SageMaker jobs of an lmstack execution that was aborted, timed out or failed",
            event_pattern=events.EventPattern(
                source=["aws.states"], detail_type=["Step Functions Execution Status Change"],
                detail={"status": list(STOP_ON), "stateMachineArn": [self.training_machine.state_machine_arn]}),
            targets=[targets.SfnStateMachine(self.stop_machine, retry_attempts=20)])

    def _machine(self, construct_id, name, definition, substitutions, role, settings):
        machine = sfn.StateMachine(
            self, construct_id, state_machine_name=name, state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_file(self._definition_file(name, definition)),
            definition_substitutions=dict(substitutions), role=role, tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=log_group(self, construct_id + "Logs", retention_days=settings.log_retention_days,
                                      key=self._log_key, name=STATE_MACHINE_LOG_PREFIX + name),
                level=sfn.LogLevel.ALL, include_execution_data=True))
        acknowledge(role, "AwsSolutions-IAM5[Resource::*]", SERVICE_WILDCARD_REASON)
        return machine

    def _definition_file(self, name, definition):
        """The definition's text in a file of the cloud assembly, which the asset stages from."""
        path = pathlib.Path(cdk.Stage.of(self).outdir) / ("%s.asl.json" % name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(state_machine.definition_text(definition))
        return str(path)


def _pick(values, definition, declared, machine):
    """The substitutions of one definition: every placeholder it uses must be declared and have a value."""
    undeclared = sorted(name for name in placeholders(definition) if name not in declared)
    missing = [name for name in declared if name not in values]
    if undeclared or missing:
        raise ValueError("the %s definition: placeholders used but not declared: %s; declared but without a value "
                         "in the stack: %s (the stack provides: %s)" % (
                             machine, ", ".join(undeclared) or "none", ", ".join(missing) or "none",
                             ", ".join(sorted(values))))
    return {name: values[name] for name in declared}
