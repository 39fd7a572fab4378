"""The gate's Lambda function (`controlplane.gate.handler`): its code staged at synth
(`stacks.gate_code.stage` into the cloud assembly, `Code.from_asset` of that directory: no Docker), its
published version, its log group and its role.

The state machine invokes the published version (`current_version`: a new version whenever the code or
the configuration changes, so a running execution keeps the code it started with), and its role may
invoke only that version (`stacks.state_machine.REQUIRED_ACTIONS`, resource kind "gate").
"""
import pathlib

from aws_cdk import Duration, Stack, Stage
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from controlplane import gate
from stacks import gate_code
from stacks.common import log_group
from stacks.nag import Grant, acknowledge, add_grants

# What the quota check (controlplane.quotas.look_up) calls: two read-only listings of Service Quotas.
QUOTA_ACTIONS = ["servicequotas:ListServiceQuotas", "servicequotas:ListAWSDefaultServiceQuotas"]
# Service Authorization Reference, "Actions, resources, and condition keys for Service Quotas": these read
# actions list no resource type (the `quota` resource applies only to RequestServiceQuotaIncrease and
# PutServiceQuotaIncreaseRequestIntoTemplate), so a statement with them must name Resource "*".
QUOTA_REASON = ("servicequotas:ListServiceQuotas and ListAWSDefaultServiceQuotas (read-only): the actions have no "
                "resource-level permissions, so IAM only accepts Resource \"*\"; the gate reads SageMaker's quotas "
                "before any job starts.")

# What the price lookup (controlplane.pricing) calls: the Price List Query API's GetProducts. Service
# Authorization Reference, "Actions, resources, and condition keys for AWS Price List": its actions list no
# resource type, so a statement with them must name Resource "*".
PRICING_ACTIONS = ["pricing:GetProducts"]
PRICING_REASON = ("pricing:GetProducts (read-only, public prices): the AWS Price List's actions have no resource-level "
                  "permissions, so IAM only accepts Resource \"*\"; the gate reads the on-demand price of each "
                  "instance type it plans or budgets.")


class Gate(Construct):
    """The gate's function, its published version, its log group and its role."""

    def __init__(self, scope: Construct, construct_id: str, *, deployment: gate.Deployment, log_retention_days: int,
                 log_key: kms.IKey) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        code = gate_code.stage(pathlib.Path(Stage.of(self).outdir) / "gate")
        self.log_group = log_group(self, "Logs", retention_days=log_retention_days, key=log_key)
        # aws:SourceAccount in a Lambda execution role's trust policy, as AWS's own lambda-trust-policy.json
        # has it (GitHub aws/agent-toolkit-for-aws, skills/.../deploying-custom-domain-rest-api/scripts).
        self.role = iam.Role(
            self, "Role", description="lmstack gate: decides about an execution input; reads quotas and prices, writes its own logs",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com", conditions={
                "StringEquals": {"aws:SourceAccount": stack.account}}))
        policy = iam.Policy(self, "Policy", roles=[self.role])
        add_grants(policy, [
            Grant(["logs:CreateLogStream", "logs:PutLogEvents"], [self.log_group.log_group_arn],
                  reason="The function's own log group: Lambda names a stream per execution environment at run "
                         "time (the group's ARN ends with :*, covering its streams)."),
            Grant(QUOTA_ACTIONS, ["*"], reason=QUOTA_REASON),
            Grant(PRICING_ACTIONS, ["*"], reason=PRICING_REASON),
        ])
        self.function = lambda_.Function(
            self, "Function", description="lmstack: checks and plans an execution input (controlplane.gate)",
            runtime=lambda_.Runtime(gate_code.RUNTIME, lambda_.RuntimeFamily.PYTHON), handler=gate_code.HANDLER,
            code=lambda_.Code.from_asset(str(code)), role=self.role, timeout=Duration.seconds(gate_code.TIMEOUT_SECONDS),
            memory_size=gate_code.MEMORY_MB, log_group=self.log_group,
            environment=deployment.environment())
        acknowledge(self.function, "AwsSolutions-L1", gate_code.RUNTIME_REASON)
        self.function.node.add_dependency(policy)  # its logs from the first invocation on
        self.version = self.function.current_version
