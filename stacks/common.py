"""Small helpers the constructs share."""
from aws_cdk import aws_logs as logs
from constructs import Construct


def log_group(scope: Construct, construct_id: str, *, retention_days: int) -> logs.LogGroup:
    """A log group kept for `retention_days` (a value CloudWatch accepts; `Settings` checks it)."""
    group = logs.LogGroup(scope, construct_id)
    group.node.default_child.retention_in_days = retention_days
    return group
