"""The customer-managed KMS key for the SNS topic and the CloudWatch log groups.

The key policy names each service principal that uses the key and nothing broader:
- logs.<region>.amazonaws.com, only for log groups of this account and region (the
  kms:EncryptionContext:aws:logs:arn condition), per "Encrypt log data in CloudWatch Logs using
  AWS Key Management Service" (CloudWatch Logs User Guide, encrypt-log-data-kms);
- cloudwatch.amazonaws.com, to publish alarm notifications to the encrypted topic, limited to
  alarms of this account (aws:SourceAccount), per "Encryption at rest: compatibility with AWS
  services" (SNS Developer Guide, sns-key-management#compatibility-with-aws-services).
The state machine roles get kms:GenerateDataKey / kms:Decrypt through IAM (the key policy's
account statement lets IAM policies grant it), as SNS requires of publishers to an encrypted topic.
"""
from aws_cdk import Aws
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

PUBLISH_ACTIONS = ["kms:GenerateDataKey", "kms:Decrypt"]
LOGS_ACTIONS = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey",
                "kms:DescribeKey"]


class EncryptionKey(Construct):
    """One key, rotation on, used by the topic and every log group of the stack."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.key = kms.Key(self, "Key", enable_key_rotation=True,
                           description="lmstack: the notification topic and the CloudWatch log groups")
        self.key.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchLogsOfThisAccount", actions=LOGS_ACTIONS, resources=["*"],
            principals=[iam.ServicePrincipal("logs.%s.amazonaws.com" % Aws.REGION)],
            conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn":
                                    "arn:%s:logs:%s:%s:log-group:*" % (Aws.PARTITION, Aws.REGION, Aws.ACCOUNT_ID)}}))
        self.key.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchAlarmsPublishToTheTopic", actions=PUBLISH_ACTIONS, resources=["*"],
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}))

    def grant_publish(self, role: iam.IGrantable) -> None:
        """What a publisher to the encrypted topic needs on the key (the state machine roles)."""
        self.key.grant(role, *PUBLISH_ACTIONS)
