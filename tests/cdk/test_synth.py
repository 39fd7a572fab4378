"""Whole-app checks: cdk-nag, cfn-lint on every template, other settings, the CDK's own validation, the CLI."""
import ipaddress
import json
import os
import subprocess

import aws_cdk as cdk
import pytest

import aws_rules
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import lint

from lmstack.demo_run import cdk_environment
from stacks.settings import Settings
from stacks.nag import Grant, add_grants, wildcard_findings

from cdk_synth import ROOT, Synth, cdk_json_context
from stacks.app import build_app

IMPORTED = dict(existing_vpc_id="vpc-0123456789abcdef0",
                existing_subnet_ids=("subnet-0123456789abcdef0", "subnet-0123456789abcdef1"),
                existing_file_system_id="fs-0123456789abcdef0",
                existing_file_system_security_group_id="sg-0123456789abcdef0")
VARIANTS = {
    "default": Settings(),
    "nat": Settings(nat_gateways=1),
    "imported": Settings(**IMPORTED),
    "three-azs": Settings(az_count=3, vpc_cidr="10.20.0.0/22", notification_email="ops@example.com", efs_backups=False,
                          efs_throughput_mode="bursting", spot=True, region="eu-west-1", name_prefix="exp-7"),
}
# More than two zones need the deploying account: a stubbed lookup of its zones.
VARIANT_ACCOUNTS = {"three-azs": dict(account="123456789012", zones=("eu-west-1a", "eu-west-1b", "eu-west-1c"))}


def synth_variant(synth_app, variant):
    return synth_app(VARIANTS[variant], **VARIANT_ACCOUNTS.get(variant, {}))


def lint_errors(template_path, region):
    matches = lint(template_path.read_text(), regions=[region])
    return ["%s %s (%s)" % (m.rule.id, m.message, "/".join(str(p) for p in m.path)) for m in matches
            if m.rule.id.startswith("E")]


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cfn_lint_finds_no_errors(synth_app, variant):
    """The template as synthesized, and with the state machine definitions read in from their files (the
    form in which cfn-lint validates the ASL: tests/cdk/cdk_synth.inline_definitions)."""
    synth = synth_variant(synth_app, variant)
    assert lint_errors(synth.deployed_path, synth.settings.region) == []
    assert lint_errors(synth.template_path, synth.settings.region) == []
    assert aws_rules.get_azs_picks_within_the_first_two(synth.template) == []


@pytest.mark.slow
def test_cfn_lint_does_validate_the_state_machine_definition(default, tmp_path):
    """The plain-string definition is what makes cfn-lint check the ASL: a broken one is reported."""
    template = json.loads(json.dumps(default.template))
    machine = next(r for r in template["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine")
    definition = json.loads(machine["Properties"]["DefinitionString"])
    definition["States"][definition["StartAt"]]["Type"] = "Bogus"
    machine["Properties"]["DefinitionString"] = json.dumps(definition)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(template))
    assert any(error.startswith("E3601 'Bogus'") for error in lint_errors(broken, "us-east-1"))


def test_nat_variant_routes_private_subnets_through_nat(synth_app):
    synth = synth_app(VARIANTS["nat"])
    synth.assertions.resource_count_is("AWS::EC2::NatGateway", 1)
    synth.assertions.resource_count_is("AWS::EC2::InternetGateway", 1)
    routes = [r["Properties"] for r in synth.resources("AWS::EC2::Route").values()]
    assert sum("NatGatewayId" in route for route in routes) == synth.settings.az_count
    mounts = synth.resources("AWS::EFS::MountTarget")
    public = {key for key, subnet in synth.resources("AWS::EC2::Subnet").items()
              if subnet["Properties"]["MapPublicIpOnLaunch"]}
    assert len(public) == synth.settings.az_count
    assert not {m["Properties"]["SubnetId"]["Ref"] for m in mounts.values()} & public


def test_imported_vpc_and_file_system_are_used_not_created(synth_app):
    synth = synth_app(VARIANTS["imported"])
    for type_name in ("AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EFS::FileSystem", "AWS::EFS::MountTarget",
                      "AWS::EC2::VPCEndpoint", "AWS::EC2::FlowLog"):
        synth.assertions.resource_count_is(type_name, 0)
    synth.assertions.resource_count_is("AWS::EFS::AccessPoint", 0)
    nfs = [r["Properties"] for r in synth.resources("AWS::EC2::SecurityGroupIngress").values()
           if r["Properties"].get("GroupId") == IMPORTED["existing_file_system_security_group_id"]]
    assert [(rule["FromPort"], rule["ToPort"]) for rule in nfs] == [(2049, 2049)]
    machine = next(r for r in synth.resources("AWS::StepFunctions::StateMachine").values()
                   if r["Properties"]["StateMachineName"].endswith("-training"))
    values = machine["Properties"]["DefinitionSubstitutions"]
    assert [values["Subnet0"], values["Subnet1"]] == list(IMPORTED["existing_subnet_ids"])
    assert values["FileSystemId"] == IMPORTED["existing_file_system_id"]


def test_settings_reach_the_template(synth_app):
    synth = synth_variant(synth_app, "three-azs")
    subnets = [s["Properties"]["CidrBlock"] for s in synth.resources("AWS::EC2::Subnet").values()]
    assert len(subnets) == 3
    assert all(ipaddress.ip_network(cidr).subnet_of(ipaddress.ip_network("10.20.0.0/22")) for cidr in subnets)
    assert len(synth.resources("AWS::EFS::MountTarget")) == 3
    _, fs = synth.only("AWS::EFS::FileSystem")
    assert fs["Properties"]["ThroughputMode"] == "bursting"
    assert fs["Properties"].get("BackupPolicy") in (None, {"Status": "DISABLED"})  # EFS API default: off
    _, subscription = synth.only("AWS::SNS::Subscription")
    assert subscription["Properties"]["Protocol"] == "email"
    assert subscription["Properties"]["Endpoint"] == "ops@example.com"
    names = sorted(r["Properties"]["StateMachineName"] for r in synth.resources("AWS::StepFunctions::StateMachine").values())
    assert names == ["exp-7-stop-on-abort", "exp-7-training"]
    manifest = json.loads((synth.outdir / "exp-7.assets.json").read_text())
    assert all(".dkr.ecr.eu-west-1." in image["source"]["dockerBuildArgs"]["BASE_IMAGE"]
               for image in manifest["dockerImages"].values())
    assert "training-job/exp-7-*" in json.dumps(synth.resources("AWS::IAM::Policy"))


def test_cdk_nag_reports_the_finding_ids_add_grants_acknowledges(tmp_path):
    """`stacks.nag.wildcard_findings` spells findings as cdk-nag does: unacknowledged they fail synth."""
    app = cdk.App(outdir=str(tmp_path), builtin_cloud_formation_validation=False)
    stack = cdk.Stack(app, "Probe")
    bucket = s3.Bucket(stack, "Bucket", enforce_ssl=True, server_access_logs_prefix="self/")
    cdk.Validations.of(bucket).acknowledge(cdk.Acknowledgment(id="AwsSolutions-S1", reason="probe stack"))
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    iam.Policy(stack, "Plain", roles=[role]).add_statements(
        iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects("output/*")]))
    expected = wildcard_findings(["s3:GetObject"], [stack.resolve(bucket.arn_for_objects("output/*"))])
    assert expected == ["Resource::<Bucket83908E77.Arn>/output/*"]
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    with pytest.raises(Exception) as error:
        app.synth()
    assert "AwsSolutions-IAM5[%s]" % expected[0] in str(error.value) or expected[0] in str(error.value)

    acknowledged = cdk.App(outdir=str(tmp_path / "ok"), builtin_cloud_formation_validation=False)
    stack = cdk.Stack(acknowledged, "Probe")
    bucket = s3.Bucket(stack, "Bucket", enforce_ssl=True, server_access_logs_prefix="self/")
    cdk.Validations.of(bucket).acknowledge(cdk.Acknowledgment(id="AwsSolutions-S1", reason="probe stack"))
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    add_grants(iam.Policy(stack, "Granted", roles=[role]),
               [Grant(["s3:GetObject"], [bucket.arn_for_objects("output/*")], reason="probe: per-job keys")])
    cdk.Validations.of(acknowledged).add_plugins(AwsSolutionsChecks(acknowledged))
    acknowledged.synth()


@pytest.mark.slow
def test_synth_with_the_cdks_own_validation_on(tmp_path):
    synth = Synth(Settings(), tmp_path, nag=True, validation=True)
    report = json.loads((synth.outdir / "validation-report.json").read_text())
    violations = [v for plugin in report["pluginReports"] for v in plugin.get("violations", [])]
    assert violations == []


@pytest.mark.slow
def test_cdk_cli_synth_is_offline_and_quiet(tmp_path):
    exports = cdk_environment()
    for name in ("CDK_DISABLE_CLI_TELEMETRY", "CDK_DISABLE_VERSION_CHECK",
                 "AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED"):
        assert name in exports, name
    env = dict(os.environ)
    env.update(exports)
    result = subprocess.run(
        ["npx", "--no-install", "cdk", "synth", "--quiet", "--output", str(tmp_path / "cdk.out")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    template = json.loads((tmp_path / "cdk.out" / "lmstack.template.json").read_text())
    assert len(template["Resources"]) > 40
    assert "AWS::CDK::Metadata" not in json.dumps(template), "version reporting is off"
    chatter = (result.stdout + result.stderr).strip()
    assert chatter == "", chatter


def test_the_app_is_cdk_nag_clean_and_nag_is_really_on(synth_app, tmp_path):
    assert synth_app().template["Resources"], "the default app synthesized with AwsSolutionsChecks on"
    app = cdk.App(outdir=str(tmp_path), context=cdk_json_context(), builtin_cloud_formation_validation=False)
    build_app(Settings(), app=app)
    stack = app.node.find_child("lmstack")
    s3.Bucket(stack, "Unchecked")
    with pytest.raises(Exception) as error:
        app.synth()
    assert "AwsSolutions-S1" in str(error.value) and "AwsSolutions-S10" in str(error.value)
