"""IAM: the SageMaker execution role (jobs), the endpoint role, and the roles of the two state machines,
least privilege.

The state machine roles are generated from `stacks.state_machine.REQUIRED_ACTIONS` (the calls
each definition makes and the kind of resource each targets), so the policies and the
definitions cannot drift apart. SageMaker ARNs carry the lower-cased resource name; the name
prefix is lower case, so `<prefix>-*` matches every job, model and endpoint we create.
"""
from typing import Dict, List, Mapping, Optional, Sequence

from aws_cdk import ArnFormat, Aws, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_efs as efs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from controlplane import base_images
from controlplane import containers
from controlplane.bucket_layout import ARTIFACT_PREFIXES, INIT_PREFIX, MODEL_ARTIFACT_KEYS, READ_ONLY_PREFIXES
from stacks.nag import Grant, add_grants

SAGEMAKER_SERVICE = "sagemaker.amazonaws.com"
# SageMaker writes job and endpoint logs to these fixed groups, one stream per host named after the job.
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
ENDPOINT_LOG_GROUP_PREFIX = "/aws/sagemaker/Endpoints/"
# The MLflow REST calls of lm.training.tracking (and SageMaker's run for MlflowConfig), as the
# sagemaker-mlflow actions of the Service Authorization Reference ("Actions, resources, and
# condition keys for Amazon SageMaker with MLflow") name them, on the tracking server or app only.
MLFLOW_ACTIONS = ["sagemaker-mlflow:CreateExperiment", "sagemaker-mlflow:GetExperimentByName",
                  "sagemaker-mlflow:SearchRuns", "sagemaker-mlflow:CreateRun", "sagemaker-mlflow:GetRun",
                  "sagemaker-mlflow:UpdateRun", "sagemaker-mlflow:LogBatch"]
NO_RESOURCE_LEVEL = "the action has no resource-level permissions, so IAM only accepts Resource \"*\""


class Permissions(Construct):
    """The execution role jobs run as, the role endpoints run as, and one role per state machine."""

    def __init__(self, scope: Construct, construct_id: str, *, name_prefix: str, bucket: s3.IBucket,
                 file_system: efs.IFileSystem, images: Mapping[str, ecr_assets.DockerImageAsset],
                 subnets: Sequence[ec2.ISubnet], training_security_group: ec2.ISecurityGroup,
                 hosting_security_group: ec2.ISecurityGroup, raw_data_prefixes: Sequence[str] = (),
                 mlflow_resource_arn: Optional[str] = None) -> None:
        super().__init__(scope, construct_id)
        self._name_prefix = name_prefix
        self.execution_role = self._sagemaker_role("ExecutionRole", "lmstack SageMaker training jobs run as this role")
        policy = iam.Policy(self, "ExecutionPolicy", roles=[self.execution_role])
        add_grants(policy, self._execution_grants(bucket, file_system, images, subnets, training_security_group,
                                                  raw_data_prefixes))
        if mlflow_resource_arn is not None:
            add_grants(policy, [Grant(MLFLOW_ACTIONS, [mlflow_resource_arn])])
        # An endpoint reads its model and nothing else: no write to checkpoints or outputs, no file system.
        self.endpoint_role = self._sagemaker_role(
            "EndpointRole", "lmstack SageMaker endpoints run as this role: read the model artifact, pull the image")
        policy = iam.Policy(self, "EndpointPolicy", roles=[self.endpoint_role])
        add_grants(policy, self._endpoint_grants(bucket, images, subnets, hosting_security_group))
        self.training_machine_role = self._machine_role("TrainingMachineRole", "lmstack training state machine")
        self.stop_machine_role = self._machine_role("StopMachineRole", "lmstack stop-on-abort state machine")

    def grant_machine_actions(self, role: iam.Role, required: Mapping[str, Sequence[str]],
                              resources: Mapping[str, Sequence[str]]) -> None:
        """Allow `role` each action in `required` ({action: resource kinds}) on the ARNs of those kinds."""
        by_kind: Dict[str, List[str]] = {}
        for action, kinds in required.items():
            for kind in kinds:
                if kind not in resources:
                    raise ValueError("REQUIRED_ACTIONS: %s targets resource kind %r; known kinds: %s" % (
                        action, kind, ", ".join(sorted(resources))))
                by_kind.setdefault(kind, []).append(action)
        grants = []
        for kind, actions in by_kind.items():
            if kind in ("execution-role", "endpoint-role"):
                grants.append(Grant(actions, resources[kind], conditions={
                    "StringEquals": {"iam:PassedToService": SAGEMAKER_SERVICE}}))
            else:
                grants.append(Grant(actions, resources[kind], reason=MACHINE_RESOURCE_REASONS.get(kind)))
        policy = iam.Policy(self, role.node.id + "Policy", roles=[role])
        add_grants(policy, grants)

    def machine_resources(self, *, topic_arn: str, gate_version_arn: str) -> Dict[str, List[str]]:
        """ARN patterns per resource kind a state machine may target."""
        stack = Stack.of(self)
        prefix = self._name_prefix + "-*"

        def sagemaker(resource):
            return [stack.format_arn(service="sagemaker", resource=resource, resource_name=prefix)]

        return {
            "training-job": sagemaker("training-job"),
            "model": sagemaker("model"),
            "endpoint-config": sagemaker("endpoint-config"),
            "endpoint": sagemaker("endpoint"),
            "execution-role": [self.execution_role.role_arn],
            "endpoint-role": [self.endpoint_role.role_arn],
            "endpoint-alarm": [stack.format_arn(service="cloudwatch", resource="alarm", resource_name=prefix,
                                                arn_format=ArnFormat.COLON_RESOURCE_NAME)],
            "topic": [topic_arn],
            "gate": [gate_version_arn],
            "*": ["*"],
        }

    def _sagemaker_role(self, construct_id, description):
        return iam.Role(self, construct_id, description=description, assumed_by=iam.ServicePrincipal(
            SAGEMAKER_SERVICE, conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}))

    def _machine_role(self, construct_id, description):
        return iam.Role(self, construct_id, description=description, assumed_by=iam.ServicePrincipal(
            "states.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}))

    def _endpoint_grants(self, bucket, images, subnets, security_group):
        stack = Stack.of(self)
        # deploy.container lmstack: our serving image; tgi and lmi: the Hugging Face LLM DLC and LMI, from AWS's
        # account in this region
        repositories = [images[base_images.SERVING_RUNTIME].repository.repository_arn] + [
            stack.format_arn(service="ecr", account=account, resource="repository", resource_name=repository)
            for repository, _, registries, _ in containers.IMAGE_TABLES.values()
            for account in sorted(set(registries.values()))]
        log_groups = stack.format_arn(
            service="logs", resource="log-group", resource_name=ENDPOINT_LOG_GROUP_PREFIX + self._name_prefix + "-*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME)
        return [
            Grant(["s3:GetObject"], [bucket.arn_for_objects(MODEL_ARTIFACT_KEYS)],
                  reason="An endpoint downloads the model.tar.gz of the training job it serves, named at run time; "
                         "only those files."),
            # A deploy-only run (deploy.model_artifact) may serve a Hugging Face directory under models/ on TGI or
            # LMI, which SageMaker copies uncompressed (ModelDataSource, S3Prefix): it lists the prefix.
            Grant(["s3:GetObject"], [bucket.arn_for_objects(INIT_PREFIX + "*")],
                  reason="A deploy-only run serves a Hugging Face directory under models/, named at run time; read "
                         "only, only that prefix."),
            Grant(["s3:ListBucket"], [bucket.bucket_arn], conditions={"StringLike": {"s3:prefix": [INIT_PREFIX + "*"]}}),
            *_pull_grants(repositories),
            *_log_grants(log_groups, log_groups + ":log-stream:*",
                         "SageMaker creates one log group per endpoint, named after it (only our prefix), and one "
                         "stream per variant and instance."),
            *_vpc_grants(stack, subnets, security_group),
        ]

    def _execution_grants(self, bucket, file_system, images, subnets, security_group, raw_data_prefixes):
        stack = Stack.of(self)
        prefix = self._name_prefix
        repositories = list(dict.fromkeys(asset.repository.repository_arn for asset in images.values()))
        log_group = stack.format_arn(service="logs", resource="log-group", resource_name=TRAINING_LOG_GROUP,
                                     arn_format=ArnFormat.COLON_RESOURCE_NAME)
        return [
            Grant(["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                  [bucket.arn_for_objects(p + "*") for p in ARTIFACT_PREFIXES],
                  reason="Jobs write model artifacts, checkpoints, TensorBoard events and evaluation results under "
                         "per-job keys below these prefixes of the artifact bucket (an evaluation job reads a training "
                         "job's model artifact); the keys are not known in advance."),
            Grant(["s3:GetObject"], [bucket.arn_for_objects(p + "*") for p in READ_ONLY_PREFIXES],
                  reason="Read-only: prepare jobs read raw corpora (uploaded by lmstack.start --upload-corpus), "
                         "training jobs the Hugging Face directories of init_from, evaluation jobs their tasks' data, "
                         "under names chosen at run time."),
            Grant(["s3:ListBucket"], [bucket.bucket_arn],
                  conditions={"StringLike": {"s3:prefix": [p + "*" for p in ARTIFACT_PREFIXES + READ_ONLY_PREFIXES]}}),
            Grant(["s3:GetBucketLocation"], [bucket.bucket_arn]),
            *_raw_data_grants(raw_data_prefixes),
            # A FileSystemDataSource mounts through a mount target of the file system, never an access
            # point: the prepare job mounts the root read-write, training jobs the dataset read-only.
            Grant(["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"], [file_system.file_system_arn],
                  conditions={"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}),
            *_pull_grants(repositories),
            *_log_grants(log_group, log_group + ":log-stream:" + prefix + "-*",
                         "One log stream per job host (`<job>/algo-<n>-<id>`), created at run time; only streams of "
                         "our jobs."),
            *_vpc_grants(stack, subnets, security_group),
        ]


def _pull_grants(repositories):
    return [
        Grant(["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"], repositories),
        Grant(["ecr:GetAuthorizationToken"], ["*"],
              reason="ecr:GetAuthorizationToken: " + NO_RESOURCE_LEVEL + "; pulls are limited to the image "
                     "repositories by the statement above."),
    ]


def _log_grants(log_groups, log_streams, reason):
    """SageMaker's own log groups and the streams it writes for a job or an endpoint, and its metrics."""
    return [
        Grant(["logs:CreateLogGroup", "logs:DescribeLogStreams"], [log_groups], reason=reason),
        Grant(["logs:CreateLogStream", "logs:PutLogEvents"], [log_streams], reason=reason),
        Grant(["cloudwatch:PutMetricData"], ["*"],
              reason="cloudwatch:PutMetricData: " + NO_RESOURCE_LEVEL + "; the condition keeps it to "
                     "SageMaker's namespaces.",
              conditions={"StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*", "aws/sagemaker/*"]}}),
    ]


def _vpc_grants(stack, subnets, security_group):
    """What SageMaker needs to attach a job or an endpoint to our subnets with `security_group`."""

    def ec2_arn(resource, name):
        return stack.format_arn(service="ec2", resource=resource, resource_name=name)

    network_interfaces = ec2_arn("network-interface", "*")
    return [
        Grant(["ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions",
               "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:DeleteNetworkInterfacePermission"],
              ["*"], reason="EC2 Describe* and DeleteNetworkInterfacePermission: " + NO_RESOURCE_LEVEL
                            + "; SageMaker calls them to attach a VPC job or endpoint to its subnets."),
        Grant(["ec2:CreateNetworkInterface"],
              [ec2_arn("subnet", subnet.subnet_id) for subnet in subnets]
              + [ec2_arn("security-group", security_group.security_group_id), network_interfaces],
              reason="The ENIs SageMaker creates for a VPC job or endpoint get ids only when created; creation is "
                     "limited to our subnets and the role's security group."),
        Grant(["ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface"], [network_interfaces],
              reason="The ENIs get ids only when SageMaker creates them."),
    ]


def _raw_data_grants(prefixes):
    """Read-only access to the raw corpora below `prefixes` (s3://bucket/key-prefix/, the
    raw_data_prefixes setting): their objects, and listing only there."""
    by_bucket: Dict[str, List[str]] = {}
    for uri in prefixes:
        bucket, _, key = uri[len("s3://"):].partition("/")
        by_bucket.setdefault(bucket, []).append(key)
    grants = []
    for bucket, keys in by_bucket.items():
        grants.append(Grant(["s3:GetObject"], ["arn:aws:s3:::%s/%s*" % (bucket, key) for key in keys],
                            reason="Prepare jobs read the raw corpus files below the raw_data_prefixes setting; "
                                   "their names are not known in advance."))
        grants.append(Grant(["s3:ListBucket"], ["arn:aws:s3:::%s" % bucket],
                            conditions={"StringLike": {"s3:prefix": [key + "*" for key in keys]}}))
    return grants


MACHINE_RESOURCE_REASONS = {
    "training-job": "Training jobs are named `<prefix>-<kind>-<execution id>-<attempt>` at run time; only "
                    "names with our prefix.",
    "model": "Models are named after their training job at run time; only names with our prefix.",
    "endpoint-config": "Endpoint configs are named after their training job at run time; only our prefix.",
    "endpoint": "Endpoints are named at run time from the execution input; only names with our prefix.",
    "endpoint-alarm": "The no-invocations alarm of an endpoint is named after it at run time; only our prefix.",
    "*": "sagemaker:ListTrainingJobs, sagemaker:Search and cloudwatch:PutMetricData: " + NO_RESOURCE_LEVEL + ".",
}
