"""The execution input: its fields (generated from the seam tables) and the states that check it.

Every value is checked in Choice states before any job exists; a bad value ends the
execution with error `InvalidInput` and a cause that names the field, what it allows and
what it got. Defaults come from the app settings and the `lm.spec.job` tables.

An unknown field is found by comparing the input object, merged over the object rebuilt from
the known fields, with the rebuilt object (`States.JsonToString` of both): the merge keeps the
rebuilt object's key order and appends what it does not know. The cause then lists the
allowed fields and echoes the object that was given (no intrinsic can list an object's keys).
"""
import collections

from controlplane import presets, rules
from lm.spec.fields import Field, choice_message, prefix_message, range_message, type_message, unknown_message
from lm.spec import conditions
from controlplane import containers
from lm.spec import contract
from lm.spec import job
from controlplane import request
from lm.spec.hardware import HOSTING_INSTANCE_TYPES, INSTANCES
from stacks.settings import MAX_INSTANCE_COUNT, MAX_RUNTIME_SECONDS
from stacks.state_machine import asl, plan_gate

ERROR = conditions.INVALID
TOP = "top"




def _from_table(table, skip=()):
    return tuple(spec for name, spec in table.items() if name not in skip)


def _mp_fields():
    fields = []
    for name, default in job.SMP_DEFAULTS.items():
        kind = type(default)
        fields.append(Field(name, kind, default, minimum=(0 if name == "default_partition" else 1) if kind is int else None,
                            choices=job.SMP_CHOICES.get(name)))
    return tuple(fields)


# Top-level fields that are hyperparameters too: given once, at the top.
TOP_LEVEL_HYPERPARAMETERS = ("preset", "strategy")
# Hyperparameters the machine fills itself: model_config is the preset's configuration
# (`controlplane.presets`, mapped by `stacks.state_machine.training`).
RESOLVED_HYPERPARAMETERS = ("model_config",)
DEFAULT_ENDPOINT_INSTANCE_TYPE = "ml.g5.xlarge"


def schema(settings):
    """The execution input's fields, with this deployment's defaults."""
    instance_types = tuple(INSTANCES)
    return (
        Field("preset", str, settings.default_preset, choices=tuple(presets.ALL_PRESETS),
              help="model shape: a preset of the model family (controlplane.presets)"),
        Field("strategy", str, settings.default_strategy, choices=job.STRATEGIES, help="distribution strategy"),
        Field("instance_type", str, settings.default_instance_type, choices=instance_types),
        Field("instance_count", int, settings.default_instance_count, 1, MAX_INSTANCE_COUNT),
        Field("max_runtime_seconds", int, settings.default_max_runtime_seconds, 1, MAX_RUNTIME_SECONDS),
        Field("spot", bool, settings.spot, help="managed spot training (checkpoints resume the job)"),
        # CreateTrainingJob InfraCheckConfig (SageMaker API reference): the API reference neither
        # recommends it nor states its cost, so it stays off unless asked for.
        Field("infra_check", bool, False,
              help="SageMaker's hardware and network health check before the training job starts"),
        # ResourceConfig.KeepAlivePeriodInSeconds (SageMaker API reference: 0 to 21600; 0, the
        # service's default, keeps no warm pool).
        Field("keep_alive_seconds", int, 0, 0, request.MAX_KEEP_ALIVE_SECONDS,
              help="keep the training instances this long after the job as a warm pool for the next run"),
        # ResourceConfig.TrainingPlanArn (SageMaker API reference; its full pattern is checked by
        # CreateTrainingJob, the Validate stage checks the ARN's start).
        Field("training_plan_arn", str, None, prefix="arn:aws", nullable=True,
              help="run on the reserved capacity of this SageMaker training plan (its ARN)"),
        Field("data_directory", str, settings.dataset_directory, prefix="/",
              help="dataset directory on the EFS file system (manifest.json and shards)"),
        Field("hyperparameters", dict, fields=_from_table(job.HYPERPARAMETERS, skip=TOP_LEVEL_HYPERPARAMETERS + RESOLVED_HYPERPARAMETERS),
              help="overrides of lm.training.train's hyperparameters"),
        Field("mp_parameters", dict, fields=_mp_fields(), help="SMP v1 parameters (strategy smp)"),
        Field("prepare", dict, fields=(
            Field("enabled", bool, False, help="run lm.data.prepare into data_directory before training"),
            Field("force", bool, False, help="run it even when a prepare job already completed for this dataset"),
            Field("raw_s3_uri", str, None, prefix="s3://", nullable=True,
                  help="raw Pile files under this S3 prefix (null: raw_directory on EFS)"),
            Field("raw_directory", str, "/raw", prefix="/",
                  help="raw Pile files on the EFS file system, when raw_s3_uri is null"),
            Field("instance_type", str, job.PREPARE_INSTANCE_TYPE, choices=instance_types),
            Field("instance_count", int, 1, 1, MAX_INSTANCE_COUNT),
            Field("max_runtime_seconds", int, 6 * 3600, 1, MAX_RUNTIME_SECONDS),
            Field("hyperparameters", dict, fields=_from_table(job.PREPARE_HYPERPARAMETERS)),
        )),
        Field("deploy", dict, fields=(
            Field("enabled", bool, False, help="deploy the trained model to a SageMaker endpoint"),
            Field("endpoint_name", str, "default",
                  help="endpoint name after '<name_prefix>-'; an existing endpoint is updated"),
            Field("instance_type", str, DEFAULT_ENDPOINT_INSTANCE_TYPE, choices=HOSTING_INSTANCE_TYPES),
            Field("instance_count", int, 1, 1, MAX_INSTANCE_COUNT),
            Field("container", str, containers.DEFAULT_CONTAINER, choices=containers.CONTAINERS,
                  help="lmstack (lm.serving.server), tgi (Text Generation Inference) or lmi (LMI, vLLM) on the Hugging Face export"),
        )),
        Field("init_from", str, None, prefix="s3://", nullable=True,
              help="start from a Hugging Face GPT-2 directory under this S3 prefix (s3://<artifact bucket>/%s...)"
                   % contract.INIT_PREFIX),
        Field("resume_from", str, None, nullable=True,
              help="continue the checkpoints of an earlier execution of this stack: the name its failure "
                   "output gives (s3://<artifact bucket>/%s<name>/)" % contract.CHECKPOINT_PREFIX),
        Field("mlflow_experiment", str, settings.name_prefix,
              help="MLflow experiment of the run, with the mlflow_resource_arn setting (letters, digits, - _ . /)"),
        Field("min_quality", float, None, 0.0, None, nullable=True,
              help="deploy only if the final validation loss is at most this"),
        # The machine cannot run controlplane.planner (no multiplication in intrinsics, no Lambda): a client
        # that did (python -m lmstack.start) passes its estimate, which the output shows
        # next to the job's billable seconds.
        Field("plan_estimate", object, None, help="controlplane.planner.estimate(...) of this run, echoed in the output"),
    )


def object_paths(fields, path=()):
    """Every object in the input, outermost first: (path, fields)."""
    found = [(path, fields)]
    for field in fields:
        if field.type is dict:
            found.extend(object_paths(field.fields, path + (field.name,)))
    return found


def _key(path):
    return "_".join(path) if path else TOP


def _label(path, name):
    return ".".join(path + (name,))


# ---- states ----

def states(settings, first, next_state):
    """The validation states, entered at `first`, leaving a clean `$.config` for `next_state`."""
    fields = schema(settings)
    paths = object_paths(fields)
    result = collections.OrderedDict()
    depths = sorted({len(path) for path, _ in paths})

    shallow = {_key(path): collections.OrderedDict(
        (field.name, {} if field.type is dict else field.default) for field in object_fields)
        for path, object_fields in paths}
    result[first] = asl.pass_state("%s.Merge0" % first, {"input.$": "$", "defaults": shallow})
    merged = {"%s.$" % TOP: "States.JsonMerge($.defaults.%s, $.input, false)" % TOP}
    result["%s.Merge0" % first] = asl.pass_state(
        "%s.Objects1" % first if len(depths) > 1 else "%s.Rebuild" % first,
        {"defaults.$": "$.defaults", "merged": merged})
    for depth in depths[1:]:
        level = [(path, object_fields) for path, object_fields in paths if len(path) == depth]
        after = "%s.Objects%d" % (first, depth + 1) if depth + 1 in depths else "%s.Rebuild" % first
        choices = []
        for path, _ in level:
            value = "$.merged.%s.%s" % (_key(path[:-1]), path[-1])
            name = "Invalid.%s" % ".".join(path)
            choices.append(asl.rule(asl.any_of(*[{"Variable": value, test: True} for test in (
                "IsString", "IsNumeric", "IsBoolean", "IsNull")]), name))
            result[name] = asl.fail(ERROR, asl.fmt("%s %s, got {}" % (".".join(path), type_message(
                Field(path[-1], dict))), asl.to_json(value)))
        result["%s.Objects%d" % (first, depth)] = asl.choice(choices, "%s.Merge%d" % (first, depth))
        merged = {"%s.$" % _key(path): "$.merged.%s" % _key(path) for path, _ in paths if len(path) < depth}
        for path, _ in level:
            merged["%s.$" % _key(path)] = "States.JsonMerge($.defaults.%s, $.merged.%s.%s, false)" % (
                _key(path), _key(path[:-1]), path[-1])
        result["%s.Merge%d" % (first, depth)] = asl.pass_state(
            after, {"defaults.$": "$.defaults", "merged": merged})

    def rebuilt(path, object_fields):
        return collections.OrderedDict(
            (field.name, rebuilt(path + (field.name,), field.fields)) if field.type is dict
            else ("%s.$" % field.name, "$.merged.%s.%s" % (_key(path), field.name))
            for field in object_fields)

    result["%s.Rebuild" % first] = asl.pass_state(
        "%s.Texts" % first, {"merged.$": "$.merged", "config": rebuilt((), fields)})

    texts = collections.OrderedDict()
    for path, object_fields in paths:
        config = _config_path(path)
        texts["known_%s.$" % _key(path)] = asl.to_json(config)
        texts["all_%s.$" % _key(path)] = asl.to_json(
            "States.JsonMerge($.merged.%s, %s, false)" % (_key(path), config))
        for field in object_fields:
            if field.type is int:
                texts["int_%s_%s.$" % (_key(path), field.name)] = asl.to_json("%s.%s" % (config, field.name))
    result["%s.Texts" % first] = asl.pass_state("%s.Check" % first, texts, result_path="$.checks")

    choices = []
    for path, object_fields in paths:
        label = ".".join(path) if path else "the input"
        name = "Invalid.%s.unknown" % (".".join(path) if path else "input")
        choices.append(asl.rule(asl.negate({"Variable": "$.checks.all_%s" % _key(path),
                                          "StringEqualsPath": "$.checks.known_%s" % _key(path)}), name))
        given = "$.merged.%s" % _key(path) if path else "$.merged.%s" % TOP
        result[name] = asl.fail(ERROR, asl.fmt(
            "%s; got {}" % unknown_message(label, [field.name for field in object_fields]), asl.to_json(given)))
    for path, object_fields in paths:
        for field in object_fields:
            if field.type is not dict:
                for test, message, kind in _field_rules(path, field):
                    name = "Invalid.%s.%s" % (_label(path, field.name), kind)
                    choices.append(asl.rule(test, name))
                    result[name] = asl.fail(ERROR, asl.fmt(
                        "%s %s, got {}" % (_label(path, field.name), message),
                        asl.to_json("%s.%s" % (_config_path(path), field.name))))
    result["%s.Check" % first] = asl.choice(choices, "%s.Clean" % first)
    result["%s.Clean" % first] = asl.pass_state("%s.Plan" % first, {"config.$": "$.config"})
    result.update(plan_gate.states("%s.Plan" % first, "%s.Rules" % first))
    result.update(_cross_field_states(settings, "%s.Rules" % first, "%s.Names" % first))
    result.update(_name_states(settings, "%s.Names" % first, "%s.Hosts" % first))
    result.update(_host_states("%s.Hosts" % first, "%s.Batch" % first))
    result.update(_batch_states("%s.Batch" % first, next_state))
    return result


def _config_path(path):
    return "$.config" + "".join(".%s" % part for part in path)


def _field_rules(path, field):
    """(condition, message, kind) for one scalar field, in the order they must be tried."""
    value = "%s.%s" % (_config_path(path), field.name)

    def when_set(condition):
        return asl.all_of({"Variable": value, "IsNull": False}, condition) if field.nullable else condition

    found = []
    if field.type is object:
        return found
    if field.type is bool:
        found.append((asl.negate({"Variable": value, "IsBoolean": True}), type_message(field), "type"))
    elif field.type is str:
        found.append((when_set(asl.negate({"Variable": value, "IsString": True})), type_message(field), "type"))
        if field.choices:
            found.append((when_set(asl.negate(asl.string_in(value, field.choices))), choice_message(field),
                          "choice"))
        if field.prefix:
            found.append((when_set(asl.negate({"Variable": value, "StringMatches": field.prefix + "*"})),
                          prefix_message(field), "prefix"))
    else:
        found.append((when_set(asl.negate({"Variable": value, "IsNumeric": True})), type_message(field), "type"))
        if field.type is int:
            text = "$.checks.int_%s_%s" % (_key(path), field.name)
            # Integral numbers written as floats (2.0) pass, as in `controlplane.rules.check`.
            found.append((asl.any_of(
                asl.all_of({"Variable": text, "StringMatches": "*.*"},
                           asl.negate({"Variable": text, "StringMatches": "*.0"})),
                {"Variable": text, "StringMatches": "*e-*"}, {"Variable": text, "StringMatches": "*E-*"}),
                type_message(field), "integer"))
        bounds = []
        if field.minimum is not None:
            bounds.append({"Variable": value, "NumericLessThan": field.minimum})
        if field.maximum is not None:
            bounds.append({"Variable": value, "NumericGreaterThan": field.maximum})
        if bounds:
            found.append((when_set(asl.any_of(*bounds)), range_message(field), "range"))
    return found


def _cross_field_states(settings, name, next_state):
    """`controlplane.rules.cross_field_rules`: one Choice rule and one Fail state per rule."""
    states_ = collections.OrderedDict()
    choices = []
    for found in rules.cross_field_rules(settings.runtimes):
        state = "Invalid.%s" % found.name
        choices.append(asl.rule(asl.condition(found.when), state))
        pieces = found.message.split("{value}") if found.subject else [found.message]
        states_[state] = asl.fail(found.error, asl.fmt("{}".join(pieces), *[
            asl.to_json("$.config.%s" % found.subject)] * (len(pieces) - 1)))
    states_[name] = asl.choice(choices, next_state)
    states_.move_to_end(name, last=False)
    return states_


def _name_path(found):
    return found.path if found.path == rules.EXECUTION_NAME else "$.config.%s" % found.path


def _name_states(settings, first, next_state):
    """`controlplane.rules.name_rules`, before any job exists.

    Intrinsics have no regular expressions nor a string length. `States.StringSplit(value, chars)`
    splits at every character of `chars` and drops the empty pieces (the Step Functions developer
    guide's example: "This.is+a,test=string" split at ".+,=" gives five words), so splitting a
    name at every allowed character leaves nothing exactly when it holds no other character;
    StringMatches "*-" finds a bad last character. The length of the endpoint name is checked by
    SageMaker itself: DescribeEndpoint refuses a name over 63 characters with a ValidationException
    ("failed to satisfy constraint"), and says "Could not find endpoint" for a valid, new one (an
    endpoint that exists is fine: the deploy stage updates it). Any other error lets the run go on.
    """
    found = rules.name_rules(settings.name_prefix)
    states = collections.OrderedDict()
    values = collections.OrderedDict()
    for index, name_rule in enumerate(found):
        values["value_%d.$" % index] = _name_path(name_rule)
        values["others_%d.$" % index] = "States.ArrayLength(States.StringSplit(%s, %s))" % (
            _name_path(name_rule), asl.quote(name_rule.alphabet))
    states[first] = asl.pass_state(first + ".Check", values, result_path="$.names")
    choices = []
    for index, name_rule in enumerate(found):
        value = "$.names.value_%d" % index
        bad = [{"Variable": value, "StringEquals": ""},
               {"Variable": "$.names.others_%d" % index, "NumericGreaterThan": 0}]
        if name_rule.alphanumeric_last:
            bad += [{"Variable": value, "StringMatches": "*" + char}
                    for char in name_rule.alphabet if char not in rules.ALPHANUMERIC]
        state = "Invalid.%s" % name_rule.name
        choices.append(asl.rule(asl.any_of(*bad), state))
        states[state] = asl.fail(ERROR, asl.fmt("%s must be %s, got {}" % (name_rule.label, name_rule.describes),
                                                asl.to_json(value)))
    endpoint = first + ".Endpoint"
    states[first + ".Check"] = asl.choice(choices + [asl.rule(
        {"Variable": "$.config.deploy.enabled", "BooleanEquals": True}, endpoint)], next_state)
    endpoint_rule = found[0]
    states[endpoint] = asl.task(asl.sdk("sagemaker", "describeEndpoint"), {
        "EndpointName.$": asl.fmt("%s-{}" % settings.name_prefix, "$.config.deploy.endpoint_name")}, next_state,
        result_path=None, catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": "$.names.error",
                                  "Next": endpoint + ".Refused"}])
    states[endpoint + ".Refused"] = asl.choice([asl.rule(
        {"Variable": "$.names.error.Cause", "StringMatches": "*failed to satisfy constraint*"},
        "Invalid.%s.length" % endpoint_rule.name)], next_state)
    states["Invalid.%s.length" % endpoint_rule.name] = asl.fail(ERROR, asl.fmt(
        "%s must be %s, got {} (SageMaker: {})" % (endpoint_rule.label, endpoint_rule.describes),
        asl.to_json("$.config.deploy.endpoint_name"), "$.names.error.Cause"))
    return states


# States.ArrayRange returns at most 1,000 items (intrinsic functions, Step Functions developer guide).
ARRAY_RANGE_MAX_ITEMS = 1000
BATCH = "$.config.hyperparameters.global_batch_size"


def _multiple(value, step):
    """Is `value` a multiple of `step` (both paths to positive integers, value / step < 1,000)?"""
    return "States.ArrayContains(States.ArrayRange(0, %s, %s), %s)" % (value, step, value)


def _quotient(value, step):
    """floor(value / step), under the same bounds."""
    return "States.MathAdd(States.ArrayLength(States.ArrayRange(0, %s, %s)), -1)" % (value, step)


def _batch_states(first, next_state):
    """The global batch against the data-parallel size, the runtime's rule (lm.data.dataset.TokenStream;
    `controlplane.planner.batch_unit`): a multiple of instance_count x the data-parallel ranks per host (the GPUs,
    divided by mp_parameters.partitions under SMP), and under SMP each replica's share a multiple
    of mp_parameters.microbatches.

    Intrinsics neither multiply nor divide: `States.ArrayRange(0, n, k)` holds n exactly when k
    divides n, and has floor(n / k) + 1 items. It returns at most ARRAY_RANGE_MAX_ITEMS items, so the
    batch is first divided by the ranks per host (a number from the instance table: each possible
    value gets its own literal bound) and then by instance_count; a batch of more than 999 sequences
    per GPU is not checked here (controlplane.planner, lmstack.start and lm.training.train --dry-run check it)."""
    states = collections.OrderedDict()
    gpus, partitions = "$.hosts.processes_per_host", "$.config.mp_parameters.partitions"
    per_host = "$.batch.per_host"
    states[first] = asl.choice([
        asl.rule({"Variable": "$.config.strategy", "StringEquals": "single"}, next_state),
        asl.rule({"Variable": "$.config.strategy", "StringEquals": "smp"}, first + ".Partitions")],
        first + ".PerHost")
    states[first + ".PerHost"] = asl.pass_state(first + ".Bounded", {"per_host.$": gpus}, result_path="$.batch")
    states[first + ".Partitions"] = asl.pass_state(first + ".PartitionsDivide", {
        "divides.$": _multiple(gpus, partitions)}, result_path="$.batch")
    states[first + ".PartitionsDivide"] = asl.choice([asl.rule(
        {"Variable": "$.batch.divides", "BooleanEquals": False}, "Invalid.mp_parameters.partitions.hosts")],
        first + ".PerHostSmp")
    states["Invalid.mp_parameters.partitions.hosts"] = asl.fail(ERROR, asl.fmt(
        "mp_parameters.partitions {} must divide the {} GPUs per host of instance_type {}",
        asl.to_json(partitions), asl.to_json(gpus), "$.config.instance_type"))
    states[first + ".PerHostSmp"] = asl.pass_state(first + ".Bounded", {"per_host.$": _quotient(gpus, partitions)},
                                                   result_path="$.batch")
    ranks = sorted({divisor for instance in INSTANCES.values() for divisor in range(1, max(instance.gpus, 1) + 1)
                    if max(instance.gpus, 1) % divisor == 0})
    states[first + ".Bounded"] = asl.choice([asl.rule(asl.all_of(
        {"Variable": per_host, "NumericEquals": rank},
        {"Variable": BATCH, "NumericGreaterThan": (ARRAY_RANGE_MAX_ITEMS - 1) * rank}), next_state) for rank in ranks],
        first + ".Split")
    states[first + ".Split"] = asl.pass_state(first + ".Replicas", {
        "per_host.$": per_host, "whole.$": _multiple(BATCH, per_host), "per_column.$": _quotient(BATCH, per_host)},
        result_path="$.batch")
    column = "$.batch.per_column"  # the batch over one rank per host
    states[first + ".Replicas"] = asl.pass_state(first + ".Microbatches", {
        "per_host.$": per_host, "whole.$": "$.batch.whole",
        "across.$": _multiple(column, "$.config.instance_count"),
        "per_replica.$": _quotient(column, "$.config.instance_count")}, result_path="$.batch")
    states[first + ".Microbatches"] = asl.pass_state(first + ".Check", {
        "per_host.$": per_host, "whole.$": "$.batch.whole", "across.$": "$.batch.across",
        "per_replica.$": "$.batch.per_replica",
        "micro.$": _multiple("$.batch.per_replica", "$.config.mp_parameters.microbatches")}, result_path="$.batch")
    states[first + ".Check"] = asl.choice([
        asl.rule(asl.any_of({"Variable": "$.batch.whole", "BooleanEquals": False},
                            {"Variable": "$.batch.across", "BooleanEquals": False}),
                 "Invalid.hyperparameters.global_batch_size.replicas"),
        asl.rule(asl.all_of({"Variable": "$.config.strategy", "StringEquals": "smp"},
                            {"Variable": "$.batch.micro", "BooleanEquals": False}),
                 "Invalid.hyperparameters.global_batch_size.microbatches")], next_state)
    states["Invalid.hyperparameters.global_batch_size.replicas"] = asl.fail(ERROR, asl.fmt(
        "hyperparameters.global_batch_size must be a multiple of the data-parallel size (instance_count {} x {} "
        "ranks per host), which the runtime requires, got {} (python -m lmstack.plan names the nearest valid one)",
        asl.to_json("$.config.instance_count"), asl.to_json(per_host), asl.to_json(BATCH)))
    states["Invalid.hyperparameters.global_batch_size.microbatches"] = asl.fail(ERROR, asl.fmt(
        "hyperparameters.global_batch_size gives each model replica {} sequences, which do not split into "
        "mp_parameters.microbatches {}, got {}", asl.to_json("$.batch.per_replica"),
        asl.to_json("$.config.mp_parameters.microbatches"), asl.to_json(BATCH)))
    return states


def _host_states(name, next_state):
    """`$.hosts.processes_per_host`: one MPI process per GPU (at least one), from the instance table."""
    groups = collections.OrderedDict()
    for instance_type, instance in INSTANCES.items():
        groups.setdefault(job.processes_per_host("horovod", instance.gpus), []).append(instance_type)
    states_ = collections.OrderedDict()
    rules = []
    for processes, instance_types in groups.items():
        state = "%s.%d" % (name, processes)
        if processes != 1:
            rules.append(asl.rule(asl.string_in("$.config.instance_type", instance_types), state))
        states_[state] = asl.pass_state(next_state, result={"processes_per_host": processes}, result_path="$.hosts")
    states_[name] = asl.choice(rules, "%s.1" % name)
    states_.move_to_end(name, last=False)
    return states_
