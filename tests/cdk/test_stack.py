"""Template assertions per construct, on the default settings (cdk-nag runs in every synth here)."""
import json
import re

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam

from controlplane.bucket_layout import ARTIFACT_PREFIXES, CHECKPOINT_PREFIX, READ_ONLY_PREFIXES
from controlplane.metrics import METRIC_DEFINITIONS
from controlplane.base_images import RUNTIMES, base_image_uri
from stacks import state_machine
from stacks.settings import INTERFACE_ENDPOINT_SERVICES, Settings, SettingsError
from stacks.nag import Grant, add_grants
from stacks.network import INTERFACE_ENDPOINTS

PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
# A deploying account whose zone lookup (stubbed as cdk.context.json would hold it) finds five zones.
ACCOUNT = "123456789012"
ACCOUNT_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f")


def _ref_id(value):
    """The logical id a {"Ref"} or {"Fn::GetAtt"} points to."""
    if "Ref" in value:
        return value["Ref"]
    return value["Fn::GetAtt"][0]


def _statements(synth, role_id):
    """Every statement of every AWS::IAM::Policy attached to the role `role_id`."""
    found = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            found.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return found


def _as_list(value):
    return value if isinstance(value, list) else [value]


def _role_id(synth, logical_prefix):
    return next(key for key in synth.resources("AWS::IAM::Role") if key.startswith(logical_prefix))


def _machine(synth, name):
    return next(resource for resource in synth.resources("AWS::StepFunctions::StateMachine").values()
                if resource["Properties"]["StateMachineName"] == name)


# ---- network ----

def test_vpc_has_only_isolated_subnets_and_no_internet_path(default):
    default.assertions.resource_count_is("AWS::EC2::VPC", 1)
    subnets = default.resources("AWS::EC2::Subnet")
    assert len(subnets) == default.settings.az_count
    assert all(subnet["Properties"]["MapPublicIpOnLaunch"] is False for subnet in subnets.values())
    for type_name in ("AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::EIP"):
        default.assertions.resource_count_is(type_name, 0)


def _interface_endpoints(synth):
    return [e for e in synth.resources("AWS::EC2::VPCEndpoint").values()
            if e["Properties"].get("VpcEndpointType") == "Interface"]


def test_only_the_free_s3_gateway_endpoint_by_default(default):
    """Nothing in the jobs or the serving container calls an AWS API but S3 (stacks/network.py): no
    interface endpoint, whose six cost about $88 a month in two zones, and no security group for them."""
    endpoints = default.resources("AWS::EC2::VPCEndpoint").values()
    (gateway,) = [e for e in endpoints if e["Properties"].get("VpcEndpointType", "Gateway") == "Gateway"]
    assert "s3" in json.dumps(gateway["Properties"]["ServiceName"])
    assert _interface_endpoints(default) == []
    assert not [key for key in default.resources("AWS::EC2::SecurityGroup") if key.startswith("NetworkEndpoint")]
    assert tuple(INTERFACE_ENDPOINTS) == INTERFACE_ENDPOINT_SERVICES


def test_interface_endpoints_by_setting_in_the_first_two_zones(synth_app):
    settings = Settings(interface_endpoints=("sts", "sagemaker.api"))
    interface = _interface_endpoints(synth_app(settings))
    names = sorted(json.dumps(e["Properties"]["ServiceName"]) for e in interface)
    assert len(names) == 2 and '.sagemaker.api"' in names[0] and '.sts"' in names[1], names
    assert all(e["Properties"]["PrivateDnsEnabled"] is True for e in interface)
    # In the first two zones only, of the five the training subnets cover in this account.
    synth = synth_app(settings, account=ACCOUNT, zones=ACCOUNT_ZONES)
    subnets = synth.resources("AWS::EC2::Subnet")
    first_two = {key for key, subnet in subnets.items() if subnet["Properties"]["AvailabilityZone"] in ACCOUNT_ZONES[:2]}
    interface = _interface_endpoints(synth)
    assert len(interface) == 2 and len(subnets) == 5 and all({_ref_id(s) for s in e["Properties"]["SubnetIds"]} == first_two for e in interface)


def test_flow_logs_capture_all_traffic(default):
    _, flow_log = default.only("AWS::EC2::FlowLog")
    assert flow_log["Properties"]["TrafficType"] == "ALL"
    assert flow_log["Properties"]["ResourceType"] == "VPC"


def test_training_security_group_admits_only_itself(default):
    training_id = next(key for key in default.resources("AWS::EC2::SecurityGroup")
                       if key.startswith("NetworkTrainingSecurityGroup"))
    assert "SecurityGroupIngress" not in default.template["Resources"][training_id]["Properties"]
    rules = [rule["Properties"] for rule in default.resources("AWS::EC2::SecurityGroupIngress").values()]
    into_training = [rule for rule in rules if _ref_id(rule["GroupId"]) == training_id]
    assert len(into_training) == 1
    assert into_training[0]["IpProtocol"] == "-1"
    assert _ref_id(into_training[0]["SourceSecurityGroupId"]) == training_id
    # Nothing anywhere is opened to an address range: every ingress names a source group.
    assert all("CidrIp" not in rule and "CidrIpv6" not in rule for rule in rules)
    for group in default.resources("AWS::EC2::SecurityGroup").values():
        assert not group["Properties"].get("SecurityGroupIngress")


def test_training_security_group_lets_efa_through_both_ways(default):
    """EFA's OS-bypass traffic needs the group to allow all traffic from itself and to itself, each a rule naming
    the group ("Step 1: Prepare an EFA-enabled security group", Amazon EC2 User Guide,
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html#efa-start-security: an ingress rule with
    source and an egress rule with destination the group itself, protocol -1); an egress rule to 0.0.0.0/0 does
    not stand in for the second (EKS's default cluster group keeps both, "View Amazon EKS security group
    requirements for clusters")."""
    training_id = next(key for key in default.resources("AWS::EC2::SecurityGroup")
                       if key.startswith("NetworkTrainingSecurityGroup"))

    def rules_of(resource_type):
        return [rule["Properties"] for rule in default.resources(resource_type).values()
                if _ref_id(rule["Properties"]["GroupId"]) == training_id]

    (inbound,) = rules_of("AWS::EC2::SecurityGroupIngress")
    (outbound,) = rules_of("AWS::EC2::SecurityGroupEgress")
    assert inbound["IpProtocol"] == outbound["IpProtocol"] == "-1"
    assert _ref_id(inbound["SourceSecurityGroupId"]) == _ref_id(outbound["DestinationSecurityGroupId"]) == training_id
    assert not {"FromPort", "ToPort", "CidrIp", "CidrIpv6"} & (set(inbound) | set(outbound))
    # What the jobs reach outside the group (S3, EFS, endpoints, a NAT gateway) stays open.
    inline = default.template["Resources"][training_id]["Properties"]["SecurityGroupEgress"]
    assert [(rule["IpProtocol"], rule["CidrIp"]) for rule in inline] == [("-1", "0.0.0.0/0")]


def test_endpoints_and_efs_accept_only_the_training_jobs(synth_app):
    synth = synth_app(Settings(interface_endpoints=("sts", "sagemaker.api")))
    rules = [rule["Properties"] for rule in synth.resources("AWS::EC2::SecurityGroupIngress").values()]
    by_group = {}
    for rule in rules:
        by_group.setdefault(_ref_id(rule["GroupId"]), []).append(rule)
    efs_group = next(key for key in by_group if key.startswith("StorageFileSystemSecurityGroup"))
    endpoint_group = next(key for key in by_group if key.startswith("NetworkEndpointSecurityGroup"))
    for group, port in ((efs_group, 2049), (endpoint_group, 443)):
        (rule,) = by_group[group]
        assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", port, port)
        assert _ref_id(rule["SourceSecurityGroupId"]).startswith("NetworkTrainingSecurityGroup")


# ---- storage ----

def test_efs_is_encrypted_backed_up_elastic_and_mounted_in_every_subnet(default):
    fs_id, fs = default.only("AWS::EFS::FileSystem")
    props = fs["Properties"]
    assert props["Encrypted"] is True
    assert props["ThroughputMode"] == "elastic"
    assert props["BackupPolicy"] == {"Status": "ENABLED"}
    assert fs["DeletionPolicy"] == "Retain"
    mounts = [m["Properties"] for m in default.resources("AWS::EFS::MountTarget").values()]
    subnets = set(default.resources("AWS::EC2::Subnet"))
    assert sorted(_ref_id(m["SubnetId"]) for m in mounts) == sorted(subnets)
    assert all(_ref_id(m["FileSystemId"]) == fs_id for m in mounts)


def test_no_access_point_since_training_jobs_cannot_mount_through_one(default):
    default.assertions.resource_count_is("AWS::EFS::AccessPoint", 0)


def test_without_an_account_the_subnets_take_only_the_first_two_of_get_azs(default, synth_app):
    """Fn::GetAZs lists only the zones with a default subnet (CloudFormation's Fn::GetAZs page): no index past 1."""
    subnets = default.resources("AWS::EC2::Subnet").values()
    picks = sorted(subnet["Properties"]["AvailabilityZone"]["Fn::Select"][0] for subnet in subnets)
    assert default.settings.az_count == 2 and picks == [0, 1]
    assert len(default.resources("AWS::EFS::MountTarget")) == 2
    assert default.missing_context == []
    with pytest.raises(SettingsError, match="lmstack.az_count: 3 zones need the deploying account"):
        synth_app(Settings(az_count=3))


def test_with_the_account_the_subnets_cover_every_zone_it_has(synth_app):
    synth = synth_app(Settings(), account=ACCOUNT, zones=ACCOUNT_ZONES)
    assert synth.missing_context == []
    zones = [subnet["Properties"]["AvailabilityZone"] for subnet in synth.resources("AWS::EC2::Subnet").values()]
    assert sorted(zones) == sorted(ACCOUNT_ZONES) and synth.settings.az_count == 5
    assert "Fn::GetAZs" not in json.dumps(synth.template)
    assert len(synth.resources("AWS::EFS::MountTarget")) == 5
    values = _machine(synth, "lmstack-training")["Properties"]["DefinitionSubstitutions"]
    assert sorted(name for name in values if name.startswith("Subnet")) == ["Subnet%d" % i for i in range(5)]
    two = synth_app(Settings(az_count=2), account=ACCOUNT, zones=ACCOUNT_ZONES)
    assert sorted(s["Properties"]["AvailabilityZone"] for s in two.resources("AWS::EC2::Subnet").values()) == [
        "us-east-1a", "us-east-1b"]
    with pytest.raises(SettingsError, match="lmstack.az_count: 6, but account 123456789012 has 5 zones in us-east-1"):
        synth_app(Settings(az_count=6), account=ACCOUNT, zones=ACCOUNT_ZONES)


def test_a_zone_lookup_not_made_yet_is_left_to_the_cdk_cli(synth_app):
    """The first synth with an account records the lookup as missing (the CLI makes it, caches it in
    cdk.context.json and synthesizes again) instead of failing."""
    synth = synth_app(Settings(), account=ACCOUNT)
    assert synth.missing_context == ["availability-zones:account=%s:region=us-east-1" % ACCOUNT]


def test_pinned_zones_are_the_subnets_zones(synth_app):
    synth = synth_app(Settings(availability_zones=("us-east-1a", "us-east-1d")))
    zones = sorted(subnet["Properties"]["AvailabilityZone"] for subnet in synth.resources("AWS::EC2::Subnet").values())
    assert zones == ["us-east-1a", "us-east-1d"]
    values = _machine(synth, "lmstack-training")["Properties"]["DefinitionSubstitutions"]
    assert sorted(key for key in values if key.startswith("Subnet")) == ["Subnet0", "Subnet1"]


def _bucket(synth, prefix):
    return next((key, value) for key, value in synth.resources("AWS::S3::Bucket").items() if key.startswith(prefix))


def test_artifact_bucket_is_private_encrypted_versioned_logged_and_expires_checkpoints(default):
    _, bucket = _bucket(default, "StorageArtifacts")
    log_id, _ = _bucket(default, "StorageAccessLogs")
    props = bucket["Properties"]
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"}
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert _ref_id(props["LoggingConfiguration"]["DestinationBucketName"]) == log_id
    rules = {rule["Id"]: rule for rule in props["LifecycleConfiguration"]["Rules"]}
    checkpoints = rules["expire-old-checkpoints"]
    assert checkpoints["Prefix"] == CHECKPOINT_PREFIX
    assert checkpoints["ExpirationInDays"] == default.settings.artifact_retention_days
    assert rules["expire-replaced-versions"]["NoncurrentVersionExpiration"]["NoncurrentDays"] == \
        default.settings.artifact_retention_days


def test_both_buckets_refuse_plain_http(default):
    policies = default.resources("AWS::S3::BucketPolicy").values()
    assert len(policies) == 2
    for policy in policies:
        denies = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
        assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} and s["Action"] == "s3:*"
                   for s in denies)


# ---- images ----

def test_one_image_asset_per_runtime_with_its_base_image(default):
    manifest = json.loads((default.outdir / ("%s.assets.json" % default.settings.name_prefix)).read_text())
    images = list(manifest["dockerImages"].values())
    build_args = sorted(image["source"]["dockerBuildArgs"]["BASE_IMAGE"] for image in images)
    assert build_args == sorted(base_image_uri(runtime, "us-east-1") for runtime in RUNTIMES)
    assert all(image["source"]["platform"] == "linux/amd64" for image in images)


def test_only_enabled_runtimes_are_built(synth_app):
    synth = synth_app(Settings(runtimes=("tf211", "tfcurrent"), default_strategy="horovod",
                               default_instance_type="ml.p3.16xlarge", default_instance_count=2))
    manifest = json.loads((synth.outdir / "lmstack.assets.json").read_text())
    build_args = sorted(image["source"]["dockerBuildArgs"]["BASE_IMAGE"] for image in manifest["dockerImages"].values())
    assert build_args == sorted(base_image_uri(runtime, "us-east-1") for runtime in ("tf211", "tfcurrent"))
    assert sorted(k for k in synth.template["Outputs"] if k.startswith("ImageUri")) == ["ImageUritf211",
                                                                                         "ImageUritfcurrent"]


# ---- IAM ----

def test_no_statement_allows_every_action(default):
    for policy in default.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            for action in _as_list(statement["Action"]):
                assert action != "*" and not action.endswith(":*"), (statement, policy)


def test_pass_role_only_the_execution_and_endpoint_roles_only_to_sagemaker(default):
    passes = []
    for policy in default.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if "iam:PassRole" in _as_list(statement["Action"]):
                passes.append((policy["Properties"]["Roles"], statement))
    assert sorted(_ref_id(role) for _, statement in passes for role in _as_list(statement["Resource"])) == sorted(
        _role_id(default, prefix) for prefix in ("PermissionsEndpointRole", "PermissionsExecutionRole"))
    for roles, statement in passes:
        assert roles == [{"Ref": _role_id(default, "PermissionsTrainingMachineRole")}]
        assert _as_list(statement["Action"]) == ["iam:PassRole"]
        assert statement["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}


def test_endpoints_read_only_the_models_they_serve_and_cannot_reach_the_file_system(default):
    role_id = _role_id(default, "PermissionsEndpointRole")
    trust = default.template["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [s["Principal"] for s in trust] == [{"Service": "sagemaker.amazonaws.com"}]
    statements = _statements(default, role_id)
    actions = {action for s in statements for action in _as_list(s["Action"])}
    assert not [a for a in actions if a.startswith(("elasticfilesystem:", "kms:")) or a in (
        "s3:PutObject", "s3:DeleteObject")], actions
    reads = [s for s in statements if any(a.startswith("s3:") for a in _as_list(s["Action"]))]
    # the model.tar.gz of any training job, and for a deploy-only run a Hugging Face directory under models/,
    # which SageMaker lists to copy (ModelDataSource S3Prefix): listing only that prefix
    objects = [s for s in reads if _as_list(s["Action"]) == ["s3:GetObject"]]
    assert sorted(resource["Fn::Join"][1][-1] for s in objects for resource in _as_list(s["Resource"])) == [
        "/models/*", "/output/*/output/model.tar.gz"]
    (listing,) = [s for s in reads if _as_list(s["Action"]) == ["s3:ListBucket"]]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["models/*"]}}
    assert len(reads) == len(objects) + 1
    assert {"ecr:BatchGetImage", "logs:PutLogEvents", "ec2:CreateNetworkInterface"} <= actions
    # Its security group: no ingress, HTTPS out only; the file system admits only the training group.
    group_id = next(key for key in default.resources("AWS::EC2::SecurityGroup") if key.startswith("NetworkHosting"))
    group = default.template["Resources"][group_id]["Properties"]
    assert not group.get("SecurityGroupIngress")
    assert [(rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) for rule in group["SecurityGroupEgress"]] == [
        ("tcp", 443, 443)]
    ingress = default.resources("AWS::EC2::SecurityGroupIngress").values()
    assert not [rule for rule in ingress if _ref_id(rule["Properties"]["SourceSecurityGroupId"]) == group_id]
    values = _machine(default, "lmstack-training")["Properties"]["DefinitionSubstitutions"]
    assert _ref_id(values["EndpointRoleArn"]) == role_id
    assert _ref_id(values["HostingSecurityGroupId"]) == group_id


@pytest.mark.parametrize("machine, role_prefix", [("training", "PermissionsTrainingMachineRole"),
                                                  ("stop", "PermissionsStopMachineRole")])
def test_machine_roles_allow_exactly_what_their_definitions_call(default, machine, role_prefix):
    statements = _statements(default, _role_id(default, role_prefix))
    granted = {}
    for statement in statements:
        for action in _as_list(statement["Action"]):
            granted.setdefault(action, []).extend(json.dumps(r) for r in _as_list(statement["Resource"]))
    required = state_machine.REQUIRED_ACTIONS[machine]
    assert set(required) <= set(granted)
    extra = set(granted) - set(required)
    # Publishing to the KMS-encrypted topic needs these two on the stack's key (SNS "Encryption at rest").
    key_id, _ = default.only("AWS::KMS::Key")
    for action in ("kms:Decrypt", "kms:GenerateDataKey"):
        assert "sns:Publish" in required and granted[action] == [json.dumps({"Fn::GetAtt": [key_id, "Arn"]})]
        extra.discard(action)
    # The rest comes from the CDK for logging and tracing.
    assert all(action.startswith(("logs:", "xray:")) for action in extra), extra
    for action, kinds in required.items():
        resources = granted[action]
        if action.startswith("sagemaker:") and "*" not in kinds:
            assert all(":sagemaker:us-east-1:" in r for r in resources), (action, resources)
            for kind in kinds:
                assert any(":%s/lmstack-*" % kind in r for r in resources), (action, kind, resources)
            assert not any(r == '"*"' for r in resources)


def test_execution_role_is_for_sagemaker_and_touches_only_its_prefixes(default):
    role_id = _role_id(default, "PermissionsExecutionRole")
    trust = default.template["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [s["Principal"] for s in trust] == [{"Service": "sagemaker.amazonaws.com"}]
    statements = _statements(default, role_id)
    objects = [s for s in statements if "s3:PutObject" in _as_list(s["Action"])]
    (put,) = objects
    suffixes = sorted(r["Fn::Join"][1][-1] for r in put["Resource"])
    assert suffixes == sorted("/%s*" % prefix for prefix in ARTIFACT_PREFIXES)
    (mount,) = [s for s in statements if "elasticfilesystem:ClientMount" in _as_list(s["Action"])]
    assert mount["Condition"] == {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}
    assert sorted(_as_list(mount["Action"])) == ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
    (read,) = [s for s in statements if _as_list(s["Action"]) == ["s3:GetObject"]]
    assert sorted(r["Fn::Join"][1][-1] for r in read["Resource"]) == sorted("/%s*" % p for p in READ_ONLY_PREFIXES)
    (pull,) = [s for s in statements if "ecr:BatchGetImage" in _as_list(s["Action"])]
    assert "container-assets" in json.dumps(pull["Resource"])
    eni = [s for s in statements if "ec2:CreateNetworkInterface" in _as_list(s["Action"])]
    assert eni and all(s["Resource"] != "*" for s in eni)


def test_a_wildcard_without_a_reason_fails_synth():
    policy = iam.Policy(cdk.Stack(cdk.App(), "Probe"), "P")
    with pytest.raises(ValueError, match=r"wildcard Resource::\* needs a written reason"):
        add_grants(policy, [Grant(["sagemaker:ListTrainingJobs"], ["*"])])


# ---- orchestration ----

@pytest.mark.parametrize("name, build, substitutions", [
    ("lmstack-training", state_machine.build_training_definition, state_machine.training_substitutions),
    ("lmstack-stop-on-abort", state_machine.build_stop_definition, state_machine.stop_substitutions),
])
def test_definitions_are_plain_json_with_every_placeholder_filled(default, name, build, substitutions):
    machine = _machine(default, name)
    props = machine["Properties"]
    assert props["StateMachineType"] == "STANDARD"
    text = props["DefinitionString"]  # read back from its file (cdk_synth.inline_definitions)
    assert isinstance(text, str), "cfn-lint validates the ASL only when DefinitionString is a plain string"
    assert text == state_machine.definition_text(build(default.settings)), "the file is the compact document"
    used = set(PLACEHOLDER.findall(text))
    assert used, "the definition uses the deployment's values"
    assert used == set(props["DefinitionSubstitutions"]), "every placeholder filled, no value unused"
    assert set(substitutions(default.settings)) == used
    assert props["LoggingConfiguration"]["Level"] == "ALL"
    assert props["LoggingConfiguration"]["IncludeExecutionData"] is True
    assert props["TracingConfiguration"] == {"Enabled": True}


def test_substitutions_point_at_the_stack_resources(default):
    values = _machine(default, "lmstack-training")["Properties"]["DefinitionSubstitutions"]
    assert _ref_id(values["ExecutionRoleArn"]).startswith("PermissionsExecutionRole")
    assert _ref_id(values["ArtifactBucket"]).startswith("StorageArtifacts")
    assert _ref_id(values["FileSystemId"]).startswith("StorageDataset")
    assert _ref_id(values["SecurityGroupId"]).startswith("NetworkTrainingSecurityGroup")
    assert _ref_id(values["TopicArn"]).startswith("NotificationsTopic")
    subnets = sorted(_ref_id(values["Subnet%d" % i]) for i in range(default.settings.az_count))
    assert subnets == sorted(default.resources("AWS::EC2::Subnet"))
    for runtime in default.settings.runtimes:
        assert "container-assets" in json.dumps(values["Image_%s" % runtime])
    assert "DebuggerRuleImage" not in values  # Debugger and Profiler are off (closed to new accounts)
    assert "Mappings" not in default.template


def test_stop_rule_starts_the_stop_machine_when_the_training_machine_ends_badly(default):
    _, rule = default.only("AWS::Events::Rule")
    pattern = rule["Properties"]["EventPattern"]
    assert pattern["source"] == ["aws.states"]
    assert pattern["detail-type"] == ["Step Functions Execution Status Change"]
    assert {"ABORTED", "TIMED_OUT"} <= set(pattern["detail"]["status"])
    training = next(k for k, v in default.resources("AWS::StepFunctions::StateMachine").items()
                    if v["Properties"]["StateMachineName"] == "lmstack-training")
    stop = next(k for k, v in default.resources("AWS::StepFunctions::StateMachine").items()
                if v["Properties"]["StateMachineName"] == "lmstack-stop-on-abort")
    assert [_ref_id(arn) for arn in pattern["detail"]["stateMachineArn"]] == [training]
    (target,) = rule["Properties"]["Targets"]
    assert _ref_id(target["Arn"]) == stop


# ---- monitoring and outputs ----

def _alarm(default, prefix):
    (alarm,) = [value for key, value in default.resources("AWS::CloudWatch::Alarm").items() if key.startswith(prefix)]
    return alarm


@pytest.mark.parametrize("alarm, machine_name", [("MonitoringFailedExecutions", "lmstack-training"),
                                                 ("MonitoringStopFailedExecutions", "lmstack-stop-on-abort")])
def test_alarm_on_failed_executions_notifies_the_topic(default, alarm, machine_name):
    """The stop machine's too: it fails when a job of an ended execution could not be stopped."""
    props = _alarm(default, alarm)["Properties"]
    assert (props["Namespace"], props["MetricName"]) == ("AWS/States", "ExecutionsFailed")
    (dimension,) = props["Dimensions"]
    machine = next(k for k, v in default.resources("AWS::StepFunctions::StateMachine").items()
                   if v["Properties"]["StateMachineName"] == machine_name)
    assert dimension["Name"] == "StateMachineArn" and _ref_id(dimension["Value"]) == machine
    assert _ref_id(props["AlarmActions"][0]).startswith("NotificationsTopic")
    default.assertions.resource_count_is("AWS::SNS::Subscription", 0)


def test_low_gpu_utilization_alarm_watches_every_training_host_and_notifies_the_topic(default):
    props = _alarm(default, "MonitoringLowGpuUtilization")["Properties"]
    (query,) = props["Metrics"]
    # Per GPU: lm.training.gpu_usage's metric, not SageMaker's GPUUtilization (the sum over a host's GPUs).
    assert query["Expression"] == 'SELECT MIN("gpu:utilization_per_gpu") FROM SCHEMA("/aws/sagemaker/TrainingJobs", Host)'
    assert "gpu:utilization_per_gpu" in [definition["Name"] for definition in METRIC_DEFINITIONS]
    assert (props["ComparisonOperator"], props["Threshold"]) == ("LessThanThreshold", 20)
    assert props["TreatMissingData"] == "notBreaching"
    assert _ref_id(props["AlarmActions"][0]).startswith("NotificationsTopic")


def test_topic_requires_tls_for_publishers(default):
    _, policy = default.only("AWS::SNS::TopicPolicy")
    (deny,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_dashboard_shows_training_metrics_per_host_and_executions(default):
    _, dashboard = default.only("AWS::CloudWatch::Dashboard")
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    metric_names = {definition["Name"] for definition in METRIC_DEFINITIONS}
    shown = set(re.findall(r'MetricName=\\\\\\"([^\\"]+)\\\\\\"', body))
    for name in ("train:loss", "train:tokens_per_second", "train:mfu", "GPUUtilization", "GPUMemoryUtilization",
                 "CPUUtilization", "DiskUtilization"):
        assert name in shown, (name, shown)
    assert {name for name in shown if ":" in name} <= metric_names, "dashboard metrics are ones lm.training.train logs"
    assert "{/aws/sagemaker/TrainingJobs,Host}" in body
    for metric in ("ExecutionsStarted", "ExecutionsSucceeded", "ExecutionsFailed"):
        assert metric in body


def test_outputs_a_user_needs(default):
    outputs = default.template["Outputs"]
    for key in ("StateMachineArn", "StateMachineConsoleUrl", "ArtifactBucketName", "FileSystemId",
                "ExampleExecutionInput"):
        assert key in outputs
    assert sorted(k for k in outputs if k.startswith("ImageUri")) == sorted("ImageUri" + r for r in RUNTIMES)
    assert json.loads(outputs["ExampleExecutionInput"]["Value"]) == state_machine.EXAMPLE_INPUT
    assert "console.aws.amazon.com/states" in json.dumps(outputs["StateMachineConsoleUrl"]["Value"])


# CloudFormation quotas: a template body from S3 is at most 1,000,000 bytes (the CDK warns at 80 %).
TEMPLATE_LIMIT = 1000000


def test_definitions_are_deployed_as_files_and_the_template_stays_small(default):
    """The definitions are file assets (DefinitionS3Location), so the template does not hold them
    (tests/state_machine/test_definition_budget.py measures the training definition against Step
    Functions' own limit); the asset each location names is the file the CDK staged."""
    for key, machine in default.deployed["Resources"].items():
        if machine["Type"] == "AWS::StepFunctions::StateMachine":
            props = machine["Properties"]
            assert "DefinitionString" not in props and "Definition" not in props, key
            assert props["DefinitionS3Location"]["Key"].endswith(".json"), key
    size = len(default.deployed_path.read_bytes())
    assert size < TEMPLATE_LIMIT / 4, "the template is %d bytes; CloudFormation's limit is %d" % (size, TEMPLATE_LIMIT)


def test_definition_writes_only_where_the_execution_role_may(default):
    """Every S3 location the training definition hands SageMaker lies under an execution-role prefix:
    written ones under ARTIFACT_PREFIXES, the raw corpora and init_from directories it reads under
    READ_ONLY_PREFIXES."""
    text = _machine(default, "lmstack-training")["Properties"]["DefinitionString"]
    segments = set(re.findall(r"s3://\$\{ArtifactBucket\}/([A-Za-z0-9_.-]*)", text))
    assert segments, "the definition names artifact locations"
    assert {segment + "/" for segment in segments} <= set(ARTIFACT_PREFIXES + READ_ONLY_PREFIXES), segments
    assert {prefix[:-1] for prefix in ARTIFACT_PREFIXES} <= segments


def test_a_placeholder_without_a_value_stops_synth():
    from stacks.orchestration import _pick
    with pytest.raises(ValueError, match="placeholders used but not declared: Bucket2"):
        _pick({"Bucket": "b"}, {"States": {"A": {"Parameters": {"Name": "${Bucket2}"}}}}, ("Bucket",), "training")
    with pytest.raises(ValueError, match="declared but without a value in the stack: Topic"):
        _pick({"Bucket": "b"}, {"x": "${Bucket}"}, ("Bucket", "Topic"), "training")


def test_raw_data_prefixes_may_be_read_and_listed_there_only(synth_app):
    synth = synth_app(Settings(raw_data_prefixes=("s3://my-corpora/pile/", "s3://my-corpora/books/")))
    statements = _statements(synth, _role_id(synth, "PermissionsExecutionRole"))
    # (the CDK merges it with the statement for the bucket's own read-only prefixes)
    (read,) = [s for s in statements if "arn:aws:s3:::my-corpora/pile/*" in _as_list(s["Resource"])]
    assert _as_list(read["Action"]) == ["s3:GetObject"]
    assert {r for r in _as_list(read["Resource"]) if isinstance(r, str)} == {
        "arn:aws:s3:::my-corpora/pile/*", "arn:aws:s3:::my-corpora/books/*"}
    (listing,) = [s for s in statements if s["Resource"] == "arn:aws:s3:::my-corpora"]
    assert _as_list(listing["Action"]) == ["s3:ListBucket"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["pile/*", "books/*"]}}
