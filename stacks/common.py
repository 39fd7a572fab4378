"""Small helpers the constructs share."""
from typing import Optional

from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct


def log_group(scope: Construct, construct_id: str, *, retention_days: int, key: kms.IKey,
              name: Optional[str] = None) -> logs.LogGroup:
    """A log group kept for `retention_days` (a value CloudWatch accepts; `Settings` checks it), encrypted with
    `key`; `name` None lets CloudFormation name it."""
    group = logs.LogGroup(scope, construct_id, encryption_key=key, log_group_name=name)
    group.node.default_child.retention_in_days = retention_days
    return group
