"""What the definitions need from the deployment: `${Name}` placeholders and IAM actions."""
import json
import re

# Filled by the CDK app through `definition_substitutions`.
TRAINING_SUBSTITUTIONS = (
    "ExecutionRoleArn",   # the SageMaker execution role of the jobs (iam:PassRole target)
    "EndpointRoleArn",    # the role endpoints run as (iam:PassRole target): reads the model artifact only
    "ArtifactBucket",     # bucket name: the prefixes of controlplane.bucket_layout.ARTIFACT_PREFIXES
    "FileSystemId",       # the EFS file system holding the dataset
    "SecurityGroupId",    # the training security group
    "HostingSecurityGroupId",  # the endpoints' security group (no NFS, HTTPS out)
    "TopicArn",           # SNS topic for phase changes and failures
    "GateFunctionArn",    # the published version of the gate's Lambda function (stacks.gate)
)
STOP_SUBSTITUTIONS = ("TopicArn",)

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")


def subnet_placeholder(index):
    return "Subnet%d" % index


def image_placeholder(runtime):
    return "Image_%s" % runtime


def training_substitutions(settings):
    """Every placeholder of `build_training_definition(settings)`, in a stable order."""
    return (TRAINING_SUBSTITUTIONS
            + tuple(subnet_placeholder(index) for index in range(settings.subnet_count))
            + tuple(image_placeholder(runtime) for runtime in settings.runtimes))


def stop_substitutions(settings):
    return STOP_SUBSTITUTIONS


def placeholders(definition):
    """The `${Name}` placeholders a definition uses."""
    return set(_PLACEHOLDER.findall(json.dumps(definition)))


def render(definition, values):
    """The definition as the deployed JSON string, with every placeholder filled (tests)."""
    text = json.dumps(definition, indent=1)
    missing = sorted(placeholders(definition) - set(values))
    if missing:
        raise KeyError("no value for placeholders %s" % ", ".join(missing))
    # Values go inside JSON strings: escape them as JSON would.
    return _PLACEHOLDER.sub(lambda match: json.dumps(str(values[match.group(1)]))[1:-1], text)


# The IAM actions each definition calls and what they act on. Resource kinds:
# "training-job", "model", "endpoint-config", "endpoint": SageMaker resources whose names
# start with `<name_prefix>-`; "execution-role", "endpoint-role": the SageMaker roles of jobs and
# endpoints (PassRole, condition iam:PassedToService = sagemaker.amazonaws.com); "endpoint-alarm":
# CloudWatch alarms named `<name_prefix>-*`; "topic": the SNS topic;
# "gate": the published version of the gate's Lambda function (that version only);
# "*": actions without resource-level permissions (ListTrainingJobs, Search, PutMetricData).
# AddTags: the create calls carry Tags, which SageMaker authorizes as AddTags.
REQUIRED_ACTIONS = {
    "training": {
        "sagemaker:CreateTrainingJob": ("training-job",),
        "sagemaker:DescribeTrainingJob": ("training-job",),
        "sagemaker:AddTags": ("training-job", "model", "endpoint-config", "endpoint"),
        "sagemaker:Search": ("*",),
        "sagemaker:CreateModel": ("model",),
        "sagemaker:CreateEndpointConfig": ("endpoint-config",),
        "sagemaker:DescribeEndpoint": ("endpoint",),
        "sagemaker:CreateEndpoint": ("endpoint", "endpoint-config"),
        "sagemaker:UpdateEndpoint": ("endpoint", "endpoint-config"),
        "iam:PassRole": ("execution-role", "endpoint-role"),
        "cloudwatch:PutMetricAlarm": ("endpoint-alarm",),
        "cloudwatch:PutMetricData": ("*",),  # each job's dollars (stacks.state_machine.bill)
        "sns:Publish": ("topic",),
        "lambda:InvokeFunction": ("gate",),
    },
    "stop": {
        "sagemaker:ListTrainingJobs": ("*",),
        "sagemaker:StopTrainingJob": ("training-job",),
        "sns:Publish": ("topic",),
    },
}
