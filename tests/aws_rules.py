"""Strict stand-in rules: what real AWS enforces (or documents as required) and moto / cdk synth do not.

A stand-in, not AWS: each rule encodes one documented requirement, cited at the rule, and returns the list
of violations (empty = the template or request passes). Tests run the rules on the synthesized template and
show each one failing on a deliberately wrong copy.
"""
import copy
import json

STATE_MACHINE_LOG_PREFIX = "/aws/vendedlogs/"


def _resources(template, type_name):
    return {key: value for key, value in template["Resources"].items() if value["Type"] == type_name}


def _refs(node):
    """Logical ids referenced anywhere in `node` (Ref and Fn::GetAtt)."""
    found = set()
    if isinstance(node, dict):
        if "Ref" in node:
            found.add(node["Ref"])
        if "Fn::GetAtt" in node:
            found.add(node["Fn::GetAtt"][0])
        for value in node.values():
            found |= _refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _refs(value)
    return found


def _statements(policy_document):
    statements = policy_document["Statement"]
    return statements if isinstance(statements, list) else [statements]


def _service_principals(statement):
    principal = statement.get("Principal", {})
    services = principal.get("Service", []) if isinstance(principal, dict) else []
    return [json.dumps(service, sort_keys=True) if not isinstance(service, str) else service
            for service in (services if isinstance(services, list) else [services])]


def _is_regional_logs_principal(service):
    """logs.<region>.amazonaws.com, literal or as the template's Fn::Join over AWS::Region."""
    return service.startswith("logs.") or service.startswith('{"Fn::Join": ["", ["logs.", {"Ref": "AWS::Region"}')


def state_machine_log_groups_are_vended(template):
    """Step Functions Developer Guide, "Avoiding Amazon CloudWatch Logs resource policy size restrictions"
    (step-functions/latest/dg/bp-cwl.html): the account's CloudWatch Logs resource policy is limited to 5120
    characters; log groups named /aws/vendedlogs/... keep state machine logging from hitting that limit."""
    groups = _resources(template, "AWS::Logs::LogGroup")
    problems = []
    for key, machine in _resources(template, "AWS::StepFunctions::StateMachine").items():
        destinations = machine["Properties"].get("LoggingConfiguration", {}).get("Destinations", [])
        for group_id in sorted(_refs(destinations) & set(groups)):
            name = groups[group_id]["Properties"].get("LogGroupName")
            if not (isinstance(name, str) and name.startswith(STATE_MACHINE_LOG_PREFIX)):
                problems.append("%s logs to %s named %r: name it %s..." % (key, group_id, name, STATE_MACHINE_LOG_PREFIX))
    return problems


def customer_managed_key_with_rotation(template):
    """AWS Config rules cloudwatch-log-group-encrypted and sns-encrypted-kms: every log group (KmsKeyId) and
    topic (KmsMasterKeyId) is encrypted with a KMS key; the key is one of this template's keys with
    EnableKeyRotation (KMS Developer Guide, "Rotate AWS KMS keys")."""
    keys = _resources(template, "AWS::KMS::Key")
    problems = ["%s: EnableKeyRotation is not true" % key for key, value in keys.items()
                if value["Properties"].get("EnableKeyRotation") is not True]
    for type_name, field in (("AWS::Logs::LogGroup", "KmsKeyId"), ("AWS::SNS::Topic", "KmsMasterKeyId")):
        for key, value in _resources(template, type_name).items():
            if not _refs(value["Properties"].get(field)) & set(keys):
                problems.append("%s (%s): %s is not a customer-managed key of this stack" % (key, type_name, field))
    return problems


def key_policy_service_principals(template):
    """CloudWatch Logs User Guide, "Encrypt log data in CloudWatch Logs using AWS KMS" (encrypt-log-data-kms):
    the key policy allows logs.<region>.amazonaws.com with a kms:EncryptionContext:aws:logs:arn condition;
    SNS Developer Guide, "Encryption at rest" (sns-key-management, compatibility with AWS services): CloudWatch
    alarms need kms:GenerateDataKey* and kms:Decrypt for cloudwatch.amazonaws.com. No other service principal,
    and none without a condition."""
    problems = []
    for key, value in _resources(template, "AWS::KMS::Key").items():
        services = {}
        for statement in _statements(value["Properties"]["KeyPolicy"]):
            for service in _service_principals(statement):
                services[service] = statement
        logs = [service for service in services if _is_regional_logs_principal(service)]
        if not logs:
            problems.append("%s: no statement for the logs.<region>.amazonaws.com principal" % key)
        for service in logs:
            condition = json.dumps(services[service].get("Condition", {}))
            if "kms:EncryptionContext:aws:logs:arn" not in condition:
                problems.append("%s: %s without a kms:EncryptionContext:aws:logs:arn condition" % (key, service))
        if "cloudwatch.amazonaws.com" not in services:
            problems.append("%s: no statement for cloudwatch.amazonaws.com (alarms cannot publish)" % key)
        else:
            actions = services["cloudwatch.amazonaws.com"]["Action"]
            actions = actions if isinstance(actions, list) else [actions]
            for needed in ("kms:Decrypt", "kms:GenerateDataKey"):
                if not any(action.rstrip("*") == needed or action == needed + "*" for action in actions):
                    problems.append("%s: cloudwatch.amazonaws.com lacks %s" % (key, needed))
        allowed = set(logs) | {"cloudwatch.amazonaws.com"}
        problems += ["%s: service principal %s is not one that uses the key" % (key, service)
                     for service in sorted(set(services) - allowed)]
    return problems


def alarm_actions_can_publish(template):
    """SNS Developer Guide, "Amazon SNS access control" / CloudWatch User Guide, "Using Amazon CloudWatch
    alarms" (an encrypted topic needs the cloudwatch.amazonaws.com principal in its policy): every alarm action
    that is a topic of this stack has a topic policy letting cloudwatch.amazonaws.com sns:Publish, with an
    aws:SourceAccount or aws:SourceArn condition (confused-deputy protection)."""
    policies = _resources(template, "AWS::SNS::TopicPolicy")
    problems = []
    for key, alarm in _resources(template, "AWS::CloudWatch::Alarm").items():
        for topic in sorted(_refs(alarm["Properties"].get("AlarmActions", []))):
            allowing = [statement for policy in policies.values() if topic in _refs(policy["Properties"]["Topics"])
                        for statement in _statements(policy["Properties"]["PolicyDocument"])
                        if statement.get("Effect") == "Allow" and "cloudwatch.amazonaws.com" in _service_principals(statement)]
            if not allowing:
                problems.append("%s: topic %s has no policy letting cloudwatch.amazonaws.com publish" % (key, topic))
            elif not any(("aws:SourceAccount" in json.dumps(s.get("Condition", {}))
                          or "aws:SourceArn" in json.dumps(s.get("Condition", {}))) for s in allowing):
                problems.append("%s: topic %s lets cloudwatch.amazonaws.com publish without an aws:SourceAccount / "
                                "aws:SourceArn condition" % (key, topic))
    return problems


def metrics_insights_alarms_are_evaluable(template):
    """CloudWatch User Guide, "Create a CloudWatch alarm based on a Metrics Insights query" and "Limits"
    (alarm-limits): an alarm's Metrics Insights query must return one time series (a GROUP BY query only
    inside a math expression that reduces it), and only the latest 3 hours of data are evaluated, so
    Period x EvaluationPeriods must fit in 3 hours."""
    problems = []
    for key, alarm in _resources(template, "AWS::CloudWatch::Alarm").items():
        queries = [query for query in alarm["Properties"].get("Metrics", [])
                   if str(query.get("Expression", "")).lstrip().upper().startswith("SELECT")]
        for query in queries:
            if "GROUP BY" in query["Expression"].upper() and query.get("ReturnData", True):
                problems.append("%s: query %s returns one series per group; alarms need one" % (key, query["Id"]))
            window = query.get("Period", 0) * alarm["Properties"].get("EvaluationPeriods", 1)
            if window > 3 * 3600:
                problems.append("%s: evaluates %d s of a Metrics Insights query, at most 10800 s are kept for "
                                "alarms" % (key, window))
    return problems


def _state_names(machine):
    for name, state in machine.get("States", {}).items():
        yield name
        for inner in [state[key] for key in ("ItemProcessor", "Iterator") if key in state] + state.get("Branches", []):
            yield from _state_names(inner)


def state_names_unique(template):
    """Amazon States Language specification, "States": state names MUST be unique within the scope of the
    whole state machine, Map item processors and Parallel branches included; CloudFormation fails the CREATE
    with "Invalid State Machine Definition: 'DUPLICATE_STATE_NAME: Duplicate State name: ...'" (cfn-lint
    issue #3616), while cfn-lint and moto accept it. (tests/cdk/test_asl_validator.py runs an independent
    validator on the same definitions.)"""
    problems = []
    for key, machine in _resources(template, "AWS::StepFunctions::StateMachine").items():
        text = machine["Properties"].get("DefinitionString")
        if not isinstance(text, str):
            problems.append("%s: DefinitionString is not one string; cannot check it" % key)
            continue
        seen = set()
        for name in _state_names(json.loads(text)):
            if name in seen:
                problems.append("%s: state name %r used more than once" % (key, name))
            seen.add(name)
    return problems


def _physical_name(resource):
    """The explicit physical name of a resource: the property named after its type (AWS::Logs::LogGroup ->
    LogGroupName, AWS::S3::Bucket -> BucketName, ...), or None."""
    return resource.get("Properties", {}).get(resource["Type"].split("::")[-1] + "Name")


def named_resources_not_retained_on_create(template):
    """CloudFormation User Guide, "DeletionPolicy attribute": with `Retain` a resource is kept "when its stack
    is deleted", and also when a failed CREATE rolls the stack back; `RetainExceptOnCreate` keeps it except
    then. A kept resource with a fixed physical name (a log group's LogGroupName) makes the retry of a failed
    first deploy fail with "already exists". So a named resource may be RetainExceptOnCreate, never Retain."""
    return ["%s (%s): named %r with DeletionPolicy Retain; use RetainExceptOnCreate or no fixed name" % (
        key, value["Type"], _physical_name(value)) for key, value in template["Resources"].items()
        if value.get("DeletionPolicy") == "Retain" and _physical_name(value) is not None]
# An account whose default VPC has default subnets in only some zones still has at least two of them
# listed: the CDK's own assumption for an environment-agnostic stack (Stack.availabilityZones).
GET_AZS_SAFE_PICKS = 2


def _get_azs_picks(node):
    """Every index an Fn::Select takes of an Fn::GetAZs list, anywhere in `node`."""
    if isinstance(node, dict):
        select = node.get("Fn::Select")
        picks = [select[0]] if isinstance(select, list) and len(select) == 2 and isinstance(select[1], dict) \
            and "Fn::GetAZs" in select[1] else []
        return picks + [pick for value in node.values() for pick in _get_azs_picks(value)]
    if isinstance(node, list):
        return [pick for value in node for pick in _get_azs_picks(value)]
    return []


def get_azs_picks_within_the_first_two(template):
    """AWS CloudFormation User Guide, "Fn::GetAZs": the list holds only the zones in which the account's
    default VPC has a default subnet (every zone only when none has one), and its order may change when a
    zone is added; Fn::Select past its end fails the stack. So a template may pick only the first two."""
    return ["%s: selects index %r of Fn::GetAZs; an account may list fewer zones" % (key, pick)
            for key, value in template["Resources"].items() for pick in _get_azs_picks(value)
            if not (isinstance(pick, int) and pick < GET_AZS_SAFE_PICKS)]


TEMPLATE_RULES = (state_machine_log_groups_are_vended, customer_managed_key_with_rotation,
                  key_policy_service_principals, alarm_actions_can_publish, metrics_insights_alarms_are_evaluable,
                  named_resources_not_retained_on_create, state_names_unique,
                  get_azs_picks_within_the_first_two)


def check_template(template):
    """Every template rule's violations, prefixed with the rule's name."""
    return ["%s: %s" % (rule.__name__, problem) for rule in TEMPLATE_RULES for problem in rule(template)]


def mutated(template, change):
    """A deep copy of `template` with `change(copy)` applied (for the deliberately wrong inputs)."""
    wrong = copy.deepcopy(template)
    change(wrong)
    return wrong


# ---- request rules: every SageMaker request the state machine makes in the moto tests ----

def _constraint_violations(shape, value, where, problems):
    """The SageMaker API reference's Length Constraints, Pattern, Valid Values, Array/Map Members and integer
    Valid Range limits, read from botocore's copy of the service model (botocore's own ParamValidator checks
    types, required and minimums only, not maximums, patterns or enums; AWS rejects those with a
    ValidationException)."""
    import re
    meta = shape.metadata
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                _constraint_violations(shape.members[name], member, "%s.%s" % (where, name), problems)
    elif shape.type_name == "list" and isinstance(value, list):
        if "max" in meta and len(value) > meta["max"]:
            problems.append("%s: %d items, at most %d allowed" % (where, len(value), meta["max"]))
        for index, item in enumerate(value):
            _constraint_violations(shape.member, item, "%s[%d]" % (where, index), problems)
    elif shape.type_name == "map" and isinstance(value, dict):
        if "max" in meta and len(value) > meta["max"]:
            problems.append("%s: %d entries, at most %d allowed" % (where, len(value), meta["max"]))
        for key, item in value.items():
            _constraint_violations(shape.key, key, "%s key %r" % (where, key), problems)
            _constraint_violations(shape.value, item, "%s[%r]" % (where, key), problems)
    elif shape.type_name in ("integer", "long") and isinstance(value, int) and not isinstance(value, bool):
        # botocore checks an integer's minimum only (e.g. RetryStrategy.MaximumRetryAttempts: 1-30,
        # KeepAlivePeriodInSeconds: 0-21600).
        if "max" in meta and value > meta["max"]:
            problems.append("%s: %d, at most %d allowed" % (where, value, meta["max"]))
    elif shape.type_name == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            # e.g. ProductionVariantInstanceType (CreateEndpointConfig): ml.p3dn.24xlarge trains but cannot host.
            problems.append("%s: %r is not one of the API's %d values for %s" % (where, value, len(shape.enum),
                                                                                shape.name))
        if "max" in meta and len(value) > meta["max"]:
            problems.append("%s: %d characters, at most %d allowed: %r" % (where, len(value), meta["max"], value))
        pattern = meta.get("pattern")
        if pattern:
            try:
                matched = re.fullmatch(pattern, value, re.DOTALL)
            except re.error:
                return  # a Java-only construct (\p{...}); botocore cannot check it either
            if not matched:
                problems.append("%s: %r does not match the API's pattern %s" % (where, value, pattern))


def api_constraints(operation, parameters):
    """Length, pattern and count limits of the SageMaker API reference for `operation` (e.g. TrainingJobName:
    Pattern ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}, so at most 63 characters including any attempt suffix)."""
    from lmstack.local_sfn import SAGEMAKER_MODEL
    problems = []
    _constraint_violations(SAGEMAKER_MODEL.operation_model(operation).input_shape, parameters, operation,
                           problems)
    return problems


def profiler_off_tensorboard_on(operation, parameters):
    """SageMaker Developer Guide, "Amazon SageMaker Debugger availability change" / "Profiler availability
    change": Debugger and Profiler are closed to new accounts, so a CreateTrainingJob must carry no
    ProfilerRuleConfigurations / DebugRuleConfigurations (their rule images) and ProfilerConfig.DisableProfiler
    true (what the SageMaker Python SDK sends for disable_profiler=True; leaving ProfilerConfig out turns the
    default system monitoring on). TensorBoardOutputConfig (CreateTrainingJob API reference) is what replaces
    them here, so a training job (tag lmstack:kind = train; a prepare job writes no events) must carry it with
    an S3OutputPath."""
    if operation != "CreateTrainingJob":
        return []
    tags = {tag["Key"]: tag["Value"] for tag in parameters.get("Tags", [])}
    problems = ["%s: present (Debugger/Profiler rules are closed to new accounts)" % field
                for field in ("ProfilerRuleConfigurations", "DebugRuleConfigurations") if field in parameters]
    if parameters.get("ProfilerConfig", {}).get("DisableProfiler") is not True:
        problems.append("ProfilerConfig.DisableProfiler: must be true, got %r" % parameters.get("ProfilerConfig"))
    if tags.get("lmstack:kind") == "train" and not parameters.get("TensorBoardOutputConfig", {}).get("S3OutputPath"):
        problems.append("TensorBoardOutputConfig.S3OutputPath: missing")
    return problems


def warm_pool_not_spot(operation, parameters):
    """SageMaker Developer Guide, "SageMaker Managed Warm Pools", Considerations: "SageMaker Managed Warm Pools
    cannot be used with spot instances": a CreateTrainingJob with EnableManagedSpotTraining true must not ask
    for ResourceConfig.KeepAlivePeriodInSeconds."""
    if operation != "CreateTrainingJob" or not parameters.get("EnableManagedSpotTraining"):
        return []
    keep_alive = parameters.get("ResourceConfig", {}).get("KeepAlivePeriodInSeconds")
    return ["ResourceConfig.KeepAlivePeriodInSeconds: %r with EnableManagedSpotTraining (warm pools cannot be used "
            "with spot instances)" % keep_alive] if keep_alive else []


REQUEST_RULES = (api_constraints, profiler_off_tensorboard_on, warm_pool_not_spot)




# ---- the EFS file system's directories: stateful across the jobs of a test ----

def _decoded(value):
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def _normalized(path):
    return "/" + "/".join(part for part in str(path).split("/") if part)


class FileSystem:
    """The directories of one EFS file system as SageMaker finds them when a job starts (a stand-in, not EFS).

    SageMaker API reference, FileSystemDataSource: `DirectoryPath` is "the full path to the directory to
    associate with the channel", a path from the file system's root (training jobs mount the file system over
    NFS without EFS access points), which SageMaker mounts when the job starts: a directory that does not exist
    fails the job then, after its instances were provisioned (SageMaker Developer Guide, "Setting up training
    jobs to access datasets", Amazon EFS). A fresh file system holds only its root; nothing else makes
    directories on it but a job that mounts it read-write and creates them. Here that is a prepare job (tag
    lmstack:kind = prepare) with a read-write channel on the root: lm.data.prepare creates the directory named by
    its `dataset_directory` argument first thing, so the directory exists from its creation on (the state
    machine starts a training job only after that prepare job completed)."""

    def __init__(self, file_system_id, directories=()):
        self.file_system_id = file_system_id
        self.directories = {"/"}
        for directory in directories:
            self.make(directory)

    def make(self, path):
        """`mkdir -p path`."""
        parts = [part for part in _normalized(path).split("/") if part]
        for end in range(1, len(parts) + 1):
            self.directories.add("/" + "/".join(parts[:end]))

    def mounts(self, parameters):
        """(channel, directory path, access mode) of each channel on this file system."""
        found = []
        for channel in parameters.get("InputDataConfig", []):
            source = channel.get("DataSource", {}).get("FileSystemDataSource")
            if source and source.get("FileSystemId") == self.file_system_id:
                found.append((channel["ChannelName"], source["DirectoryPath"], source["FileSystemAccessMode"]))
        return found

    def start(self, operation, parameters):
        """The problems of one request against the directories that exist now; then what the job makes."""
        if operation != "CreateTrainingJob":
            return []
        problems = ["InputDataConfig[%s]: DirectoryPath %r does not exist on file system %s (it has %s)" % (
            channel, path, self.file_system_id, ", ".join(sorted(self.directories)))
            for channel, path, _ in self.mounts(parameters) if _normalized(path) not in self.directories]
        tags = {tag["Key"]: tag["Value"] for tag in parameters.get("Tags", [])}
        root_rw = any(_normalized(path) == "/" and mode == "rw" for _, path, mode in self.mounts(parameters))
        target = _decoded(parameters.get("HyperParameters", {}).get("dataset_directory"))
        if not problems and tags.get("lmstack:kind") == "prepare" and root_rw and isinstance(target, str):
            self.make(target)
        return problems


def s3_inputs_readable(operation, parameters, readable_prefixes):
    """SageMaker Developer Guide, "How to use SageMaker AI execution roles" (CreateTrainingJob API: execution
    role permissions): the role needs s3:ListBucket and s3:GetObject on each S3 input channel's data; a channel
    the role may not read fails the job when it downloads or mounts its data, after the instances started.
    `readable_prefixes`: the s3://bucket/prefix/ locations the deployment's execution role may read."""
    if operation != "CreateTrainingJob":
        return []
    problems = []
    for channel in parameters.get("InputDataConfig", []):
        source = channel.get("DataSource", {}).get("S3DataSource")
        if source and not any(source["S3Uri"].startswith(prefix) for prefix in readable_prefixes):
            problems.append("InputDataConfig[%s]: S3Uri %r is outside what the execution role may read (%s)" % (
                channel["ChannelName"], source["S3Uri"], ", ".join(readable_prefixes)))
    return problems


def check_requests(calls, file_system=None, readable_prefixes=None):
    """Violations of every request rule by each SageMaker call in `calls` ((resource type, action, parameters)
    as lmstack.local_sfn.scheduled_calls returns them), in order; with `file_system` (a `FileSystem`, which
    the calls then change) also every EFS channel whose directory does not exist when its job starts; with
    `readable_prefixes` every S3 channel the execution role may not read."""
    problems = []
    for resource_type, action, parameters in calls:
        if "sagemaker" not in resource_type:
            continue
        operation = action[0].upper() + action[1:]
        problems += ["%s: %s" % (rule.__name__, problem) for rule in REQUEST_RULES
                     for problem in rule(operation, parameters)]
        if file_system is not None:
            problems += ["efs_directories_exist: %s" % problem for problem in file_system.start(operation, parameters)]
        if readable_prefixes is not None:
            problems += ["s3_inputs_readable: %s" % problem
                         for problem in s3_inputs_readable(operation, parameters, readable_prefixes)]
    return problems
