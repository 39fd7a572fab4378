"""The app's settings: one frozen, validated dataclass, read from the CDK context.

`cdk.json` holds the defaults under the context key `lmstack` (a JSON object); any
single field can be overridden on the command line as `-c lmstack:<field>=<value>`
(for example `npx cdk synth -c lmstack:az_count=3 -c lmstack:runtimes=tf211,tfcurrent`).
Values from the command line arrive as strings and are parsed by the field's type.
Every value is checked once, here; an error names the key and what it allows.
"""
import dataclasses
import ipaddress
import json
import re
import typing
from typing import Any, Mapping, Optional, Tuple

from lm.spec import conditions
from lm.spec.fields import check as check_field
from controlplane import rules
from controlplane.inputs import MAX_INSTANCE_COUNT, MAX_RUNTIME_SECONDS, input_hyperparameters
from controlplane.presets import ALL_PRESETS
from lm.spec.hardware import INSTANCES
from lm.spec.job import STRATEGIES
from controlplane.base_images import PREPARE_RUNTIME, RUNTIMES, SERVING_RUNTIME, STRATEGY_RUNTIME

CONTEXT_KEY = "lmstack"
OVERRIDE_PREFIX = CONTEXT_KEY + ":"

# Regions the stack is built and tested for (the DLC base images are pulled from there).
REGIONS = ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "ap-northeast-1")
# The Availability Zones of each region a new account gets (ap-northeast-1b is closed to new
# accounts): an upper bound for az_count. GPU instance types are offered only in some zones, and which
# ones cannot be asked offline (the zone IDs behind the names also differ per account): with the
# deploying account known at synth, the training subnets cover every zone it has (a context lookup,
# `stacks.network.zones`), so SageMaker may place a job in any of them.
REGION_ZONE_COUNTS = {"us-east-1": 6, "us-east-2": 3, "us-west-2": 4, "eu-west-1": 3, "ap-northeast-1": 3}
# Without an account at synth the template can only name zones by `Fn::GetAZs` index, and that list
# holds only the zones where the account's default VPC has a default subnet (CloudFormation
# `Fn::GetAZs` page): like the CDK for an environment-agnostic stack, take at most its first two.
ACCOUNTLESS_ZONES = 2

# Interface endpoints a new VPC may get (the setting interface_endpoints; their callers: stacks/network.py).
INTERFACE_ENDPOINT_SERVICES = ("ecr.api", "ecr.dkr", "logs", "sagemaker.api", "sagemaker.experiments",
                               "sagemaker.runtime", "sts")
# What a job that logs to SageMaker managed MLflow (mlflow_resource_arn) reaches from a new VPC without NAT.
MLFLOW_ENDPOINT_SERVICE = "sagemaker.experiments"
EFS_THROUGHPUT_MODES = ("elastic", "bursting")
# The values CloudWatch Logs accepts for a log group's retention.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
                      3288, 3653)
MAX_AZ_COUNT = 6

_NAME_PREFIX = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_NAME_PREFIX_MAX = 16
_VPC_ID = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_SECURITY_GROUP_ID = re.compile(r"^sg-[0-9a-f]{8,17}$")
_FILE_SYSTEM_ID = re.compile(r"^fs-[0-9a-f]{8,40}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_EFS_PATH = re.compile(r"^(/[A-Za-z0-9._-]+)+$")
_ZONE = re.compile(r"^[a-z]{2}-[a-z]+-\d[a-z]$")
# s3://bucket/ or s3://bucket/key/prefix/ (S3 bucket naming rules; the key prefix ends with /)
# MlflowConfig.MlflowResourceArn (SageMaker API reference, AIMlflowConfig / MlflowConfig): a managed
# MLflow tracking server or MLflow app. Here in the stack's own region (the training jobs reach it
# through the region's SageMaker API).
_MLFLOW_ARN = r"^arn:aws[a-z\-]*:sagemaker:%s:[0-9]{12}:mlflow-(app|tracking-server)/[A-Za-z0-9-]+$"
_S3_PREFIX = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([^*?]+/)?$")


class SettingsError(ValueError):
    """One or more settings are invalid; the message names each key."""


@dataclasses.dataclass(frozen=True)
class Settings:
    name_prefix: str = "lmstack"
    region: str = "us-east-1"
    # None: every zone the deploying account has in the region (looked up at synth), or the first
    # ACCOUNTLESS_ZONES of Fn::GetAZs without an account; one per pinned zone or imported subnet.
    az_count: Optional[int] = None
    availability_zones: Tuple[str, ...] = ()  # pin the subnets to these zones (names such as us-east-1a)
    nat_gateways: int = 0
    vpc_cidr: str = "10.0.0.0/16"
    interface_endpoints: Tuple[str, ...] = ()  # of INTERFACE_ENDPOINT_SERVICES; none has a caller by default
    existing_vpc_id: Optional[str] = None
    existing_subnet_ids: Tuple[str, ...] = ()
    existing_file_system_id: Optional[str] = None
    existing_file_system_security_group_id: Optional[str] = None
    efs_throughput_mode: str = "elastic"
    efs_backups: bool = True
    artifact_retention_days: int = 30
    log_retention_days: int = 365
    runtimes: Tuple[str, ...] = tuple(RUNTIMES)
    default_instance_type: str = "ml.g5.2xlarge"
    default_instance_count: int = 1
    default_strategy: str = "single"
    default_preset: str = "gpt-125m"
    default_max_runtime_seconds: int = 24 * 3600
    # The execution input's default hyperparameters, where they differ from lm.training.train's (a JSON object in
    # cdk.json, kept as sorted (name, value) pairs). These make the empty input `{}` a run that fits: 16 sequences
    # of gpt-125m with activation recomputation on one A10G (the runtime's 64 without it need 345 GiB).
    default_hyperparameters: Tuple[Tuple[str, Any], ...] = (("global_batch_size", 16), ("recompute", True))
    spot: bool = False
    # EnableInterContainerTrafficEncryption of every job: IPsec between the hosts of a job, slower
    # all-reduce (controlplane.planner counts ENCRYPTED_ALLREDUCE_SLOWDOWN), no effect on one host.
    inter_container_traffic_encryption: bool = True
    notification_email: Optional[str] = None
    dataset_directory: str = "/datasets"
    raw_data_prefixes: Tuple[str, ...] = ()  # S3 prefixes of raw corpora the jobs may read, besides raw/
    # SageMaker managed MLflow: training jobs send MlflowConfig and log to it (lm.training.tracking).
    mlflow_resource_arn: Optional[str] = None

    def __post_init__(self):
        for name in ("runtimes", "existing_subnet_ids", "availability_zones", "raw_data_prefixes",
                     "interface_endpoints"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        if isinstance(self.default_hyperparameters, dict):
            object.__setattr__(self, "default_hyperparameters", tuple(sorted(self.default_hyperparameters.items())))
        if self.az_count is None:
            object.__setattr__(self, "az_count", _default_zone_count(self))
        errors = [message for message in _check(self) if message]
        if errors:
            raise SettingsError("invalid lmstack settings:\n  " + "\n  ".join(errors))

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> "Settings":
        """Settings from all CDK context values: the `lmstack` object, then `lmstack:<field>` overrides."""
        fields = {field.name: field for field in dataclasses.fields(cls)}
        base = context.get(CONTEXT_KEY) or {}
        if isinstance(base, str):
            base = _parse_json(CONTEXT_KEY, base)
        if not isinstance(base, dict):
            raise SettingsError("context %r must be a JSON object, got %r" % (CONTEXT_KEY, base))
        values = {}
        errors = []
        for key, value in base.items():
            if key not in fields:
                errors.append("%s.%s: unknown setting; allowed: %s" % (CONTEXT_KEY, key, ", ".join(fields)))
                continue
            values[key] = value
        for key, value in context.items():
            if not key.startswith(OVERRIDE_PREFIX):
                continue
            name = key[len(OVERRIDE_PREFIX):]
            if name not in fields:
                errors.append("%s: unknown setting; allowed: %s" % (key, ", ".join(fields)))
                continue
            try:
                value = _parse_text(name, fields[name].type, value) if isinstance(value, str) else value
            except SettingsError as error:
                errors.append(str(error))
                continue
            if _is_pairs(fields[name].type) and isinstance(value, dict):
                # An override of a JSON-object setting adds to its entries (or changes them), so
                # `-c 'lmstack:default_hyperparameters={"max_steps":500}'` keeps the other defaults.
                base = values.get(name, fields[name].default)
                base = dict(base) if isinstance(base, tuple) else base  # the field's default: (name, value) pairs
                value = dict(base, **value) if isinstance(base, dict) else value
            values[name] = value
        for name, value in values.items():
            message = _check_type(name, fields[name].type, value)
            if message:
                errors.append(message)
        if errors:
            raise SettingsError("invalid lmstack settings:\n  " + "\n  ".join(errors))
        return cls(**values)

    @property
    def subnet_count(self) -> int:
        """The number of training subnets: az_count, or ACCOUNTLESS_ZONES while the zones are not
        looked up (the stack resolves az_count from the lookup: `stacks.network.zones`)."""
        return self.az_count if self.az_count is not None else ACCOUNTLESS_ZONES

    @property
    def creates_vpc(self) -> bool:
        return self.existing_vpc_id is None

    @property
    def creates_file_system(self) -> bool:
        return self.existing_file_system_id is None


def _default_zone_count(s):
    """One subnet per zone: the pinned zones, the imported subnets, or None (decided at synth)."""
    if isinstance(s.availability_zones, tuple) and s.availability_zones:
        return len(s.availability_zones)
    if s.existing_vpc_id is not None and isinstance(s.existing_subnet_ids, tuple) and s.existing_subnet_ids:
        return len(s.existing_subnet_ids)
    return None


def _key(name):
    return "%s.%s" % (CONTEXT_KEY, name)


def _parse_json(name, text):
    try:
        return json.loads(text)
    except ValueError:
        raise SettingsError("%s: not valid JSON: %r" % (name, text))


def _parse_text(name, annotation, text):
    """A command-line string as the field's type: `3`, `true`, `a,b` or `["a","b"]`, `none`."""
    optional, base = _unwrap(annotation)
    stripped = text.strip()
    if optional and stripped.lower() in ("", "none", "null"):
        return None
    if base is bool:
        lowered = stripped.lower()
        if lowered in ("true", "yes", "1"):
            return True
        if lowered in ("false", "no", "0"):
            return False
        raise SettingsError("%s: must be true or false, got %r" % (_key(name), text))
    if base is int:
        try:
            return int(stripped)
        except ValueError:
            raise SettingsError("%s: must be an integer, got %r" % (_key(name), text))
    if base is tuple and _is_pairs(annotation):
        return _parse_json(_key(name), stripped)
    if base is tuple:
        if stripped.startswith("["):
            return _parse_json(_key(name), stripped)
        return tuple(part.strip() for part in stripped.split(",") if part.strip())
    return text


def _is_pairs(annotation):
    """A setting kept as (name, value) pairs and written as a JSON object (default_hyperparameters)."""
    args = typing.get_args(annotation)
    return bool(args) and typing.get_origin(args[0]) is tuple


def _unwrap(annotation):
    """(is Optional, base type) of a field annotation: str, int, bool or tuple."""
    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) is typing.Union and type(None) in args
    if optional:
        annotation = next(arg for arg in args if arg is not type(None))
    origin = typing.get_origin(annotation)
    return optional, (origin if origin is not None else annotation)


def _check_type(name, annotation, value):
    optional, base = _unwrap(annotation)
    if value is None:
        return None if optional else "%s: must be set" % _key(name)
    if base is tuple and _is_pairs(annotation):
        ok = isinstance(value, dict) or (isinstance(value, tuple) and all(
            isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) for pair in value))
        return None if ok else "%s: must be a JSON object, got %r" % (_key(name), value)
    if base is tuple:
        ok = isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value)
        return None if ok else "%s: must be a list of strings, got %r" % (_key(name), value)
    if base is int and (isinstance(value, bool) or not isinstance(value, int)):
        return "%s: must be an integer, got %r" % (_key(name), value)
    if base is not int and not isinstance(value, base):
        return "%s: must be %s, got %r" % (_key(name), {bool: "true or false", str: "a string"}[base], value)
    return None


def _check_range(name, value, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return "%s: must be an integer from %d to %d, got %r" % (_key(name), low, high, value)
    return None


def _check_choice(name, value, allowed):
    if value not in allowed:
        return "%s: %r is not allowed; allowed: %s" % (_key(name), value, ", ".join(str(item) for item in allowed))
    return None


def _check_pattern(name, value, pattern, what):
    if not isinstance(value, str) or not pattern.match(value):
        return "%s: must be %s, got %r" % (_key(name), what, value)
    return None


def _check(settings):
    """Yield one message per invalid field (None for a valid one)."""
    s = settings
    for field in dataclasses.fields(s):
        yield _check_type(field.name, field.type, getattr(s, field.name))
    yield _check_pattern("name_prefix", s.name_prefix, _NAME_PREFIX,
                         "lower-case letters, digits and single hyphens, starting with a letter")
    if isinstance(s.name_prefix, str) and len(s.name_prefix) > _NAME_PREFIX_MAX:
        yield "%s: at most %d characters (it starts every job name, which SageMaker caps at 63), got %r" % (
            _key("name_prefix"), _NAME_PREFIX_MAX, s.name_prefix)
    yield _check_choice("region", s.region, REGIONS)
    if s.az_count is not None:
        yield _check_range("az_count", s.az_count, 1, MAX_AZ_COUNT)
    yield from _check_zones(s)
    if isinstance(s.az_count, int):  # else checked again once the stack has resolved the zones
        yield _check_range("nat_gateways", s.nat_gateways, 0, max(1, s.az_count))
    yield from _check_network(s)
    yield from _check_interface_endpoints(s)
    yield from _check_file_system(s)
    yield _check_choice("efs_throughput_mode", s.efs_throughput_mode, EFS_THROUGHPUT_MODES)
    yield _check_range("artifact_retention_days", s.artifact_retention_days, 1, 3650)
    yield _check_choice("log_retention_days", s.log_retention_days, LOG_RETENTION_DAYS)
    yield from _check_runtimes(s)
    yield _check_choice("default_instance_type", s.default_instance_type, tuple(INSTANCES))
    yield _check_range("default_instance_count", s.default_instance_count, 1, MAX_INSTANCE_COUNT)
    yield _check_choice("default_strategy", s.default_strategy, STRATEGIES)
    yield from _check_strategy_fit(s)
    yield _check_choice("default_preset", s.default_preset, tuple(ALL_PRESETS))
    yield _check_range("default_max_runtime_seconds", s.default_max_runtime_seconds, 1, MAX_RUNTIME_SECONDS)
    yield from _check_default_hyperparameters(s)
    if s.notification_email is not None:
        yield _check_pattern("notification_email", s.notification_email, _EMAIL, "an e-mail address")
    yield _check_pattern("dataset_directory", s.dataset_directory, _EFS_PATH,
                         "an absolute EFS path such as /datasets (letters, digits, . _ -; no trailing /)")
    if isinstance(s.dataset_directory, str) and ".." in s.dataset_directory.split("/"):
        yield "%s: must not contain '..', got %r" % (_key("dataset_directory"), s.dataset_directory)
    if s.mlflow_resource_arn is not None and isinstance(s.region, str):
        yield _check_pattern("mlflow_resource_arn", s.mlflow_resource_arn, re.compile(_MLFLOW_ARN % re.escape(s.region)),
                             "the ARN of a SageMaker managed MLflow tracking server or app in region %s "
                             "(arn:aws:sagemaker:%s:<account>:mlflow-tracking-server/<name>)" % (s.region, s.region))
    for prefix in s.raw_data_prefixes if isinstance(s.raw_data_prefixes, tuple) else ():
        yield _check_pattern("raw_data_prefixes", prefix, _S3_PREFIX,
                             "S3 prefixes such as s3://my-corpora/pile/ (bucket, optional key prefix ending in /)")


def _check_default_hyperparameters(s):
    """Each default hyperparameter one an execution input may give, with a value its field allows."""
    if not isinstance(s.default_hyperparameters, tuple):
        return
    allowed = {spec.name: spec for spec in input_hyperparameters()}
    for name, value in s.default_hyperparameters:
        if name not in allowed:
            yield "%s: %r is no hyperparameter an execution input may give; allowed: %s" % (
                _key("default_hyperparameters"), name, ", ".join(allowed))
            continue
        try:
            check_field(allowed[name], value, "%s.%s" % (_key("default_hyperparameters"), name))
        except ValueError as error:
            yield str(error)


def _check_zones(s):
    zones = REGION_ZONE_COUNTS.get(s.region)
    if zones and isinstance(s.az_count, int) and s.az_count > zones and not s.availability_zones:
        yield "%s: %s has %d Availability Zones, got %r" % (_key("az_count"), s.region, zones, s.az_count)
    if not s.availability_zones:
        return
    for zone in s.availability_zones:
        if not (isinstance(zone, str) and _ZONE.match(zone) and zone[:-1] == s.region):
            yield "%s: must be zone names of region %s such as %sa, got %r" % (
                _key("availability_zones"), s.region, s.region, zone)
    if len(set(s.availability_zones)) != len(s.availability_zones):
        yield "%s: listed twice: %r" % (_key("availability_zones"), s.availability_zones)
    if s.az_count != len(s.availability_zones):
        yield "%s: %r with %d availability_zones; leave it unset (null)" % (
            _key("az_count"), s.az_count, len(s.availability_zones))
    if s.existing_vpc_id is not None:
        yield "%s: only for a new VPC; an imported VPC's subnets are existing_subnet_ids" % _key("availability_zones")


def _check_network(s):
    try:
        network = ipaddress.ip_network(s.vpc_cidr, strict=True)
    except (TypeError, ValueError):
        yield "%s: must be an IPv4 CIDR block such as 10.0.0.0/16, got %r" % (_key("vpc_cidr"), s.vpc_cidr)
        return
    if network.version != 4 or not 16 <= network.prefixlen <= 24:
        yield "%s: must be an IPv4 block from /16 to /24 (what a VPC allows), got %r" % (_key("vpc_cidr"), s.vpc_cidr)
    if s.existing_vpc_id is None:
        if s.existing_subnet_ids:
            yield "%s: only used with existing_vpc_id, which is not set" % _key("existing_subnet_ids")
        return
    yield _check_pattern("existing_vpc_id", s.existing_vpc_id, _VPC_ID, "a VPC id such as vpc-0123456789abcdef0")
    for subnet in s.existing_subnet_ids:
        yield _check_pattern("existing_subnet_ids", subnet, _SUBNET_ID, "subnet ids such as subnet-0123456789abcdef0")
    if len(s.existing_subnet_ids) != s.az_count:
        yield "%s: needs one private subnet per AZ (az_count = %r), got %d" % (
            _key("existing_subnet_ids"), s.az_count, len(s.existing_subnet_ids))
    if s.nat_gateways:
        yield "%s: must be 0 with existing_vpc_id (the imported VPC keeps its own routing), got %r" % (
            _key("nat_gateways"), s.nat_gateways)


def _check_interface_endpoints(s):
    if not isinstance(s.interface_endpoints, tuple):
        return
    for service in s.interface_endpoints:
        yield _check_choice("interface_endpoints", service, INTERFACE_ENDPOINT_SERVICES)
    if len(set(s.interface_endpoints)) != len(s.interface_endpoints):
        yield "%s: listed twice: %r" % (_key("interface_endpoints"), s.interface_endpoints)
    if s.interface_endpoints and s.existing_vpc_id is not None:
        yield "%s: only for a new VPC; an imported VPC keeps its own endpoints" % _key("interface_endpoints")
    # The isolated subnets reach no AWS API but through an endpoint (or NAT): lm.training.tracking's MLflow
    # client would fail every call and the run would have no experiment record.
    if (s.mlflow_resource_arn is not None and s.existing_vpc_id is None and not s.nat_gateways
            and MLFLOW_ENDPOINT_SERVICE not in s.interface_endpoints):
        yield "%s: with %s set, the jobs reach MLflow only through the interface endpoint %r (or NAT: %s); " \
              "add it, got %r" % (_key("interface_endpoints"), _key("mlflow_resource_arn"), MLFLOW_ENDPOINT_SERVICE,
                                 _key("nat_gateways"), s.interface_endpoints)


def _check_file_system(s):
    if s.existing_file_system_id is None:
        if s.existing_file_system_security_group_id is not None:
            yield "%s: only used with existing_file_system_id, which is not set" % _key(
                "existing_file_system_security_group_id")
        return
    yield _check_pattern("existing_file_system_id", s.existing_file_system_id, _FILE_SYSTEM_ID,
                         "an EFS id such as fs-0123456789abcdef0")
    if s.existing_file_system_security_group_id is None:
        yield "%s: required with existing_file_system_id (NFS from the training jobs is opened on it)" % _key(
            "existing_file_system_security_group_id")
    else:
        yield _check_pattern("existing_file_system_security_group_id", s.existing_file_system_security_group_id,
                             _SECURITY_GROUP_ID, "a security group id such as sg-0123456789abcdef0")


def _check_runtimes(s):
    if not isinstance(s.runtimes, tuple):
        return
    if not s.runtimes:
        yield "%s: at least one is needed; allowed: %s" % (_key("runtimes"), ", ".join(RUNTIMES))
    for runtime in s.runtimes:
        yield _check_choice("runtimes", runtime, tuple(RUNTIMES))
    if len(set(s.runtimes)) != len(s.runtimes):
        yield "%s: listed twice: %r" % (_key("runtimes"), s.runtimes)
    for needed, purpose in ((SERVING_RUNTIME, "serving"), (PREPARE_RUNTIME, "data preparation")):
        if needed not in s.runtimes:
            yield "%s: %r is always needed (%s runs on it); got %r" % (_key("runtimes"), needed, purpose, s.runtimes)
    runtime = STRATEGY_RUNTIME.get(s.default_strategy)
    if runtime is not None and runtime not in s.runtimes:
        yield "%s: default_strategy %r runs on runtime %r, which is not built; add it or change the strategy" % (
            _key("runtimes"), s.default_strategy, runtime)


def _check_strategy_fit(s):
    """The input rules (`controlplane.rules`) applied to the default strategy, instance type and count;
    whether the strategy's runtime is built is `_check_runtimes`' concern."""
    defaults = {conditions.STRATEGY_FIELD: s.default_strategy, conditions.INSTANCE_TYPE_FIELD: s.default_instance_type,
                conditions.INSTANCE_COUNT_FIELD: s.default_instance_count}
    for found in rules.cross_field_rules():
        message = conditions.broken([found], defaults)
        if message:
            # The default the rule reads besides the strategy (the strategy itself for a rule over it alone).
            field = next((path for path in conditions.paths(found.when) if path != conditions.STRATEGY_FIELD),
                         conditions.STRATEGY_FIELD)
            yield "%s: %s" % (_key("default_" + field), message)
