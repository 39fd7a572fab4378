"""Storage: the EFS dataset file system (new or imported) and the S3 artifact bucket with its access logs."""
from typing import Sequence

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_efs as efs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from controlplane.bucket_layout import CHECKPOINT_PREFIX
from stacks.settings import Settings
from stacks.nag import acknowledge

INCOMPLETE_UPLOAD_DAYS = 7


class Storage(Construct):
    """EFS with NFS open only to the training jobs; the bucket.

    No access point: a training job's FileSystemDataSource mounts a DirectoryPath from the file
    system's root and cannot name one, so the prepare job mounts the root and makes the dataset
    directory itself (controlplane.request.input_channels)."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, vpc: ec2.IVpc,
                 subnets: Sequence[ec2.ISubnet], training_security_group: ec2.ISecurityGroup) -> None:
        super().__init__(scope, construct_id)
        if settings.creates_file_system:
            self.file_system = self._create_file_system(settings, vpc, subnets)
        else:
            self.file_system = efs.FileSystem.from_file_system_attributes(
                self, "ImportedFileSystem", file_system_id=settings.existing_file_system_id,
                security_group=ec2.SecurityGroup.from_security_group_id(
                    self, "ImportedFileSystemSecurityGroup", settings.existing_file_system_security_group_id,
                    allow_all_outbound=False))
        self.file_system.connections.allow_default_port_from(
            training_security_group, "NFS from the training jobs only")
        self.access_log_bucket = self._create_access_log_bucket(settings)
        self.bucket = self._create_artifact_bucket(settings)

    def _create_file_system(self, settings, vpc, subnets):
        security_group = ec2.SecurityGroup(
            self, "FileSystemSecurityGroup", vpc=vpc, allow_all_outbound=False,
            description="lmstack dataset EFS: NFS from the training jobs only")
        return efs.FileSystem(
            self, "Dataset", vpc=vpc, vpc_subnets=ec2.SubnetSelection(subnets=subnets),
            security_group=security_group, encrypted=True,
            throughput_mode=efs.ThroughputMode.ELASTIC if settings.efs_throughput_mode == "elastic"
            else efs.ThroughputMode.BURSTING,
            performance_mode=efs.PerformanceMode.GENERAL_PURPOSE,
            enable_automatic_backups=settings.efs_backups,
            # SageMaker mounts a FileSystemDataSource over plain NFS, not with IAM authorization, so
            # there is no file system policy that would refuse it; the security group is the gate.
            allow_anonymous_access=True,
            removal_policy=RemovalPolicy.RETAIN)

    def _create_access_log_bucket(self, settings):
        bucket = s3.Bucket(
            self, "AccessLogs", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(id="expire-access-logs",
                                              expiration=Duration.days(settings.log_retention_days))],
            removal_policy=RemovalPolicy.RETAIN)
        acknowledge(bucket, "AwsSolutions-S1",
                    "This is the access-log bucket of the artifact bucket; logging it into itself would loop.")
        return bucket

    def _create_artifact_bucket(self, settings):
        retention = Duration.days(settings.artifact_retention_days)
        return s3.Bucket(
            self, "Artifacts", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            server_access_logs_bucket=self.access_log_bucket, server_access_logs_prefix="artifacts/",
            lifecycle_rules=[
                s3.LifecycleRule(id="expire-old-checkpoints", prefix=CHECKPOINT_PREFIX, expiration=retention),
                s3.LifecycleRule(id="expire-replaced-versions", noncurrent_version_expiration=retention,
                                 abort_incomplete_multipart_upload_after=Duration.days(INCOMPLETE_UPLOAD_DAYS)),
            ],
            removal_policy=RemovalPolicy.RETAIN)
