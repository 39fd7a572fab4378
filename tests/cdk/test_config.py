"""Settings: defaults, cdk.json, `-c lmstack:<key>=<value>` overrides, and errors that name the key."""
import dataclasses
import json
import pathlib

import pytest

from controlplane import gate
from family_cases import tiny_presets
from lm.spec import families
from lm.spec.hardware import INSTANCES
from lm.spec.job import SMDDP_INSTANCE_TYPES, STRATEGIES
from controlplane.base_images import RUNTIMES
from stacks.settings import LOG_RETENTION_DAYS, Settings, SettingsError

CDK_JSON = pathlib.Path(__file__).resolve().parents[2] / "cdk.json"


def test_cdk_json_names_every_setting_and_is_valid():
    context = json.loads(CDK_JSON.read_text())["context"]
    assert sorted(context["lmstack"]) == sorted(field.name for field in dataclasses.fields(Settings))
    settings = Settings.from_context(context)
    assert settings.runtimes == tuple(context["lmstack"]["runtimes"])
    assert settings.notification_email is None


def test_the_empty_input_of_the_shipped_cdk_json_is_a_run_the_gate_accepts():
    """What a first run from the console pastes: `{}`. The shipped defaults plan a run that fits (16 sequences
    of gpt-125m with recomputation on one ml.g5.2xlarge), and the default hyperparameters reach the input."""
    settings = Settings.from_context(json.loads(CDK_JSON.read_text())["context"])
    decision = gate.decide({}, gate.Context(gate.Deployment.of(settings)))
    assert (decision.plan["instance_type"], decision.plan["strategy"], decision.plan["global_batch"],
            decision.plan["recompute"]) == ("ml.g5.2xlarge", "single", 16, True)
    assert decision.plan["memory_gib"] <= decision.plan["usable_gib"]
    assert dict(settings.default_hyperparameters) == {
        name: decision.config["hyperparameters"][name] for name, _ in settings.default_hyperparameters}
    # without them the runtime's own default batch, 64 sequences, does not fit there
    with pytest.raises(gate.Refusal, match="single on 1 x ml.g5.2xlarge: needs"):
        gate.decide({}, gate.Context(gate.Deployment.of(dataclasses.replace(settings, default_hyperparameters=()))))


@pytest.mark.parametrize("preset, family", tiny_presets())
def test_the_default_preset_may_be_of_any_family_and_the_empty_input_runs_it(preset, family):
    """A fork's family is a deployment's default too: `{}` is a run of the default preset's family, and a default
    hyperparameter the family cannot use gives way (rnn declares no recompute)."""
    settings = dataclasses.replace(Settings(), default_preset=preset)
    decision = gate.decide({}, gate.Context(gate.Deployment.of(settings)))
    assert (decision.config["preset"], decision.config["hyperparameters"]["model"]) == (preset, family)
    assert decision.config["hyperparameters"]["recompute"] is families.get_family(family).supports("recompute")


def test_default_hyperparameters_from_the_command_line_are_a_json_object_added_to_the_defaults():
    settings = Settings.from_context({"lmstack:default_hyperparameters": '{"max_steps": 10, "recompute": false}'})
    assert settings.default_hyperparameters == (("global_batch_size", 16), ("max_steps", 10), ("recompute", False))
    # over cdk.json's own: `{}` still fits (settings.md's example)
    context = dict(json.loads(CDK_JSON.read_text())["context"], **{
        "lmstack:default_hyperparameters": '{"max_steps": 500}'})
    settings = Settings.from_context(context)
    assert dict(settings.default_hyperparameters) == {"global_batch_size": 16, "recompute": True, "max_steps": 500}
    decision = gate.decide({}, gate.Context(gate.Deployment.of(settings)))
    assert decision.config["hyperparameters"]["max_steps"] == 500 and decision.plan["global_batch"] == 16


def test_cdk_json_runs_the_app_from_the_venv_quietly():
    config = json.loads(CDK_JSON.read_text())
    assert config["app"] == ".venv/bin/python app.py"
    assert config["versionReporting"] is False and config["notices"] is False
    assert config["context"]["cli-telemetry"] is False


def test_command_line_overrides_are_parsed_by_type():
    settings = Settings.from_context({
        "lmstack": {"az_count": 2, "spot": False},
        "lmstack:az_count": "3",
        "lmstack:spot": "true",
        "lmstack:runtimes": "tf211, tfcurrent",
        "lmstack:notification_email": "ops@example.com",
        "lmstack:default_max_runtime_seconds": "3600",
    })
    assert settings.az_count == 3 and settings.spot is True
    assert settings.runtimes == ("tf211", "tfcurrent")
    assert settings.notification_email == "ops@example.com"
    assert settings.default_max_runtime_seconds == 3600
    assert Settings.from_context({"lmstack:runtimes": '["tfcurrent"]'}).runtimes == ("tfcurrent",)
    assert Settings.from_context({"lmstack:notification_email": "none"}).notification_email is None


def test_whole_object_from_the_command_line():
    settings = Settings.from_context({"lmstack": json.dumps({"name_prefix": "exp", "az_count": 3})})
    assert (settings.name_prefix, settings.az_count) == ("exp", 3)


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().az_count = 3


@pytest.mark.parametrize("context, expected", [
    ({"lmstack": {"instance_count": 2}}, ["lmstack.instance_count: unknown setting", "default_instance_count"]),
    ({"lmstack:azcount": "2"}, ["lmstack:azcount: unknown setting", "az_count"]),
    ({"lmstack:az_count": "three"}, ["lmstack.az_count: must be an integer, got 'three'"]),
    ({"lmstack:spot": "maybe"}, ["lmstack.spot: must be true or false"]),
    ({"lmstack": {"az_count": "2"}}, ["lmstack.az_count: must be an integer, got '2'"]),
    ({"lmstack": {"runtimes": "tf211"}}, ["lmstack.runtimes: must be a list of strings"]),
    ({"lmstack": "{not json"}, ["lmstack: not valid JSON"]),
    ({"lmstack:default_hyperparameters": "global_batch_size=8"}, ["lmstack.default_hyperparameters: not valid JSON"]),
    ({"lmstack": {"default_hyperparameters": [16]}}, ["lmstack.default_hyperparameters: must be a JSON object"]),
])
def test_context_errors_name_the_key(context, expected):
    with pytest.raises(SettingsError) as error:
        Settings.from_context(context)
    for text in expected:
        assert text in str(error.value)


@pytest.mark.parametrize("changes, expected", [
    ({"default_instance_type": "ml.p9.huge"}, ["lmstack.default_instance_type", "'ml.p9.huge'"]
     + list(INSTANCES)),
    ({"default_instance_count": 0}, ["lmstack.default_instance_count: must be an integer from 1 to 64, got 0"]),
    ({"default_instance_count": True}, ["lmstack.default_instance_count"]),
    ({"vpc_cidr": "10.0.0.0/33"}, ["lmstack.vpc_cidr: must be an IPv4 CIDR block", "'10.0.0.0/33'"]),
    ({"vpc_cidr": "banana"}, ["lmstack.vpc_cidr"]),
    ({"interface_endpoints": ("s3",)}, ["lmstack.interface_endpoints: 's3' is not allowed; allowed: ecr.api, ecr.dkr"]),
    ({"interface_endpoints": ("sts", "sts")}, ["lmstack.interface_endpoints: listed twice"]),
    ({"vpc_cidr": "10.0.0.1/16"}, ["lmstack.vpc_cidr"]),
    ({"vpc_cidr": "10.0.0.0/8"}, ["lmstack.vpc_cidr: must be an IPv4 block from /16 to /24"]),
    ({"default_strategy": "zero3"}, ["lmstack.default_strategy", "'zero3'"] + list(STRATEGIES)),
    ({"runtimes": ("tf1",)}, ["lmstack.runtimes", "'tf1'"] + list(RUNTIMES)),
    ({"runtimes": ()}, ["lmstack.runtimes: at least one is needed"]),
    ({"runtimes": ("tf211",)}, ["lmstack.runtimes: default_strategy 'single' runs on runtime 'tfcurrent'"]),
    ({"runtimes": ("tfcurrent", "tfcurrent")}, ["lmstack.runtimes: listed twice"]),
    ({"runtimes": ("tf26", "tf211")}, ["lmstack.runtimes: 'tfcurrent' is always needed (serving runs on it)"]),
    ({"region": "mars-north-1"}, ["lmstack.region", "us-east-1", "eu-west-1"]),
    ({"az_count": 7}, ["lmstack.az_count: must be an integer from 1 to 6"]),
    ({"nat_gateways": 3, "az_count": 2}, ["lmstack.nat_gateways: must be an integer from 0 to 2"]),
    ({"az_count": 6, "region": "us-east-2"}, ["lmstack.az_count: us-east-2 has 3 Availability Zones, got 6"]),
    ({"availability_zones": ("us-west-2a",)}, ["lmstack.availability_zones: must be zone names of region us-east-1"]),
    ({"availability_zones": ("us-east-1a", "us-east-1a")}, ["lmstack.availability_zones: listed twice"]),
    ({"availability_zones": ("us-east-1a", "us-east-1b"), "az_count": 3}, ["lmstack.az_count: 3 with 2", "unset"]),
    ({"raw_data_prefixes": ("s3://x/",)}, ["lmstack.raw_data_prefixes: must be S3 prefixes"]),
    ({"raw_data_prefixes": ("s3://my-corpora/pile",)}, ["lmstack.raw_data_prefixes", "ending in /"]),
    ({"efs_throughput_mode": "provisioned"}, ["lmstack.efs_throughput_mode", "elastic", "bursting"]),
    ({"log_retention_days": 2}, ["lmstack.log_retention_days", "365"]),
    ({"artifact_retention_days": 0}, ["lmstack.artifact_retention_days"]),
    ({"name_prefix": "Bad_Prefix"}, ["lmstack.name_prefix: must be lower-case letters"]),
    ({"name_prefix": "a" * 17}, ["lmstack.name_prefix: at most 16 characters"]),
    ({"default_preset": "gpt-9t"}, ["lmstack.default_preset", "gpt-125m"]),
    ({"default_max_runtime_seconds": 30 * 86400}, ["lmstack.default_max_runtime_seconds"]),
    ({"default_hyperparameters": {"global_batch_size": 0}},
     ["lmstack.default_hyperparameters.global_batch_size must be between 1 and 65536"]),
    ({"default_hyperparameters": {"preset": "tiny"}},
     ["lmstack.default_hyperparameters: 'preset' is no hyperparameter an execution input may give", "max_steps"]),
    ({"notification_email": "nobody"}, ["lmstack.notification_email: must be an e-mail address"]),
    ({"dataset_directory": "datasets"}, ["lmstack.dataset_directory: must be an absolute EFS path"]),
    ({"dataset_directory": "/data/../etc"}, ["lmstack.dataset_directory: must not contain '..'"]),
    ({"default_strategy": "smddp", "runtimes": ("tf211",)},
     ["lmstack.default_instance_type: strategy smddp runs only on instance_type"] + list(SMDDP_INSTANCE_TYPES)),
    ({"default_instance_count": 2}, ["lmstack.default_instance_count: strategy single runs on one instance"]),
    ({"existing_vpc_id": "vpc-0123456789abcdef0"}, ["lmstack.existing_subnet_ids: needs one private subnet per AZ"]),
    ({"existing_vpc_id": "vpc-1", "existing_subnet_ids": ("subnet-0123456789abcdef0",) * 2},
     ["lmstack.existing_vpc_id: must be a VPC id"]),
    ({"existing_subnet_ids": ("subnet-0123456789abcdef0",)}, ["lmstack.existing_subnet_ids: only used with"]),
    ({"existing_file_system_id": "fs-0123456789abcdef0"},
     ["lmstack.existing_file_system_security_group_id: required with existing_file_system_id"]),
])
def test_invalid_settings_name_the_key_and_what_is_allowed(changes, expected):
    with pytest.raises(SettingsError) as error:
        Settings(**changes)
    for text in expected:
        assert text in str(error.value)


def test_every_error_is_reported_at_once():
    with pytest.raises(SettingsError) as error:
        Settings(az_count=0, default_preset="nope", vpc_cidr="x")
    message = str(error.value)
    assert "lmstack.az_count" in message and "lmstack.default_preset" in message and "lmstack.vpc_cidr" in message


def test_log_retention_values_are_cloudwatch_values():
    for days in LOG_RETENTION_DAYS:
        assert Settings(log_retention_days=days).log_retention_days == days


def test_imported_network_and_file_system():
    settings = Settings(existing_vpc_id="vpc-0123456789abcdef0",
                        existing_subnet_ids=["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
                        existing_file_system_id="fs-0123456789abcdef0",
                        existing_file_system_security_group_id="sg-0123456789abcdef0")
    assert not settings.creates_vpc and not settings.creates_file_system
    assert settings.existing_subnet_ids == ("subnet-0123456789abcdef0", "subnet-0123456789abcdef1")


def test_the_zone_count_is_left_to_the_stack_unless_pinned_or_imported():
    # None: every zone the account's lookup finds, or two of Fn::GetAZs without an account (stacks.network.zones).
    assert Settings().az_count is None and Settings().subnet_count == 2
    assert Settings(availability_zones=["us-east-1a", "us-east-1c"]).az_count == 2
    assert Settings(az_count=2).az_count == 2
    assert Settings(existing_vpc_id="vpc-0123456789abcdef0",
                    existing_subnet_ids=["subnet-0123456789abcdef0"] * 3).az_count == 3
    settings = Settings.from_context({"lmstack:availability_zones": "us-east-1a,us-east-1b",
                                      "lmstack:raw_data_prefixes": "s3://my-corpora/pile/"})
    assert settings.availability_zones == ("us-east-1a", "us-east-1b") and settings.az_count == 2
    assert settings.raw_data_prefixes == ("s3://my-corpora/pile/",)
