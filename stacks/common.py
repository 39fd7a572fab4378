"""Small helpers the constructs share."""
from typing import Optional

from aws_cdk import RemovalPolicy
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct


def log_group(scope: Construct, construct_id: str, *, retention_days: int, key: kms.IKey,
              name: Optional[str] = None) -> logs.LogGroup:
    """A log group kept for `retention_days` (a value CloudWatch accepts; `Settings` checks it), encrypted with
    `key`; `name` None lets CloudFormation name it.

    It outlives the stack's deletion, but a fixed name must not survive the rollback of a failed first deploy
    (the retry would fail with "already exists"): a named group is RetainExceptOnCreate."""
    group = logs.LogGroup(scope, construct_id, encryption_key=key, log_group_name=name,
                          removal_policy=RemovalPolicy.RETAIN if name is None else RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE)
    group.node.default_child.retention_in_days = retention_days
    return group
