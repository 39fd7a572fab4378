"""The deployment's policy: what an execution may ask of this stack, beyond what a job accepts.

`cross_field_rules(runtimes)` is every rule between input fields: the job's own
(`lm.spec.job.job_rules`: capabilities, strategies and instance types), the presets of each family,
the images this deployment builds, the serving containers' fit, and the prepare stage's.
`name_rules` restrict the names an execution gives AWS resources.

Read by the gate (`controlplane.gate`: the state machine's Validate state and `lmstack.start`) and
`stacks.settings` (the deployment's defaults). Adding a rule between fields is one entry here (or in
`lm.spec.job` when the job itself must refuse it); every path picks it up.
"""
import collections
import functools
import json

from controlplane import base_images
from controlplane import containers
from controlplane.presets import ALL_PRESETS, FAMILY_PRESETS
from lm.spec import job
from lm.spec.conditions import STRATEGY_FIELD, Above, All, Is, Not, OneOf, rule
from lm.spec.families import FAMILIES, get_family
from controlplane.containers import HOSTING_INSTANCE_TYPES
from controlplane.inputs import DRILL_MAX_STEPS


@functools.lru_cache(maxsize=None)
def serving_rules():
    """`deploy.container` tgi and lmi: they serve the Hugging Face export on an instance whose
    GPUs hold the model (`controlplane.containers.gpu_shards`, grouped by instance type).

    A tuple, built once: it depends only on the preset, instance and container tables."""
    found = []
    for container in containers.HF_CONTAINERS:
        found.extend(_container_fit_rules(container))
    return tuple(found)


def _container_fit_rules(container):
    chosen = (Is("deploy.enabled", True), Is("deploy.container", container))
    # the training job must write the export; a deploy-only run (deploy.model_artifact) serves one that exists
    found = [rule("deploy.container.%s.export_hf" % container, All(chosen + (
        Is("hyperparameters.export_hf", False), Is("deploy.model_artifact", None))),
                  "deploy.container %s serves the Hugging Face export: set hyperparameters.export_hf to true" % container)]
    exported = [preset for preset, config in ALL_PRESETS.items() if get_family(config.family).supports(container)]
    cannot = collections.OrderedDict()  # instance type -> [(preset, reason)]
    for preset in exported:
        for instance_type in HOSTING_INSTANCE_TYPES:
            shards, reason = containers.gpu_shards(container, ALL_PRESETS[preset], instance_type)
            if shards is None:
                cannot.setdefault(instance_type, []).append((preset, reason))
    for instance_type, rows in cannot.items():
        presets = [preset for preset, _ in rows]
        if len(presets) == len(exported):
            message = "deploy.container %s: %s; choose another deploy.instance_type" % (container, rows[0][1])
        else:
            message = "deploy.container %s cannot serve preset {value} on deploy.instance_type %s (%s); " \
                      "choose a larger deploy.instance_type or preset" % (container, instance_type, "; ".join(
                          "%s %s" % row for row in rows))
        found.append(rule("deploy.container.%s.%s" % (container, instance_type), All(chosen + (
            Is("deploy.instance_type", instance_type), OneOf("preset", presets))), message, subject="preset"))
    return found


def preset_family_rules(label="preset"):
    """The preset must be one of the model family's (`controlplane.presets`)."""
    found = []
    for family in FAMILIES:
        presets = tuple(FAMILY_PRESETS.get(family, ()))
        found.append(rule("preset.family.%s" % family, All((Is("hyperparameters.model", family),
                                                              Not(OneOf("preset", presets)))),
                          "%s {value} is not a preset of model %s; allowed: %s" % (label, family, ", ".join(presets)),
                          subject="preset"))
    return found


def cross_field_rules(runtimes=None):
    """The rules between fields for a deployment that builds `runtimes` (None: all of them)."""
    built = tuple(base_images.RUNTIMES) if runtimes is None else tuple(runtimes)
    found = preset_family_rules() + job.job_rules()
    found.extend(serving_rules())
    for strategy in job.STRATEGIES:
        runtime = base_images.STRATEGY_RUNTIME[strategy]
        if runtime not in built:
            found.append(rule("strategy.%s.runtime" % strategy, Is(STRATEGY_FIELD, strategy),
                              "strategy %s needs the %s image, which this deployment does not build (runtimes: %s)"
                              % (strategy, runtime, ", ".join(built))))
    # lm.data.prepare trains its tokenizer when it is given none (nor init_from's): once, on one instance.
    found.append(rule("prepare.tokenizer.instance_count", All((
        Is("prepare.enabled", True), Above("prepare.instance_count", 1), Is("prepare.hyperparameters.tokenizer", ""),
        Is("init_from", None))),
        "prepare trains its tokenizer (prepare.hyperparameters.tokenizer is empty, init_from is null) on one instance, "
        "got prepare.instance_count={value}: set it to 1, or give a tokenizer file on the file system (python -m "
        "lm.data.prepare train-tokenizer makes one)", subject="prepare.instance_count"))
    found.append(rule("deploy.budget_hours", All((Is("deploy.enabled", False), Above("deploy.budget_hours", 0))),
                      "deploy.budget_hours {value} counts an endpoint's hours in budget_usd: it needs deploy.enabled "
                      "true", subject="deploy.budget_hours"))
    # SageMaker developer guide, train-warm-pools, "Considerations": "SageMaker Managed Warm Pools cannot be used
    # with spot instances": CreateTrainingJob would fail, after the prepare job ran.
    found.append(rule("spot.keep_alive_seconds", All((Is("spot", True), Above("keep_alive_seconds", 0))),
                      "spot true and keep_alive_seconds {value}: SageMaker keeps no warm pool of spot instances; "
                      "set keep_alive_seconds to 0, or spot to false", subject="keep_alive_seconds"))
    # A divergence drill (lm.spec.drill) damages the run on purpose: only a short one (DRILL_MAX_STEPS).
    found.append(rule("drill.faults.max_steps", All((
        Not(Is("drill.faults", None)), Above("hyperparameters.max_steps", DRILL_MAX_STEPS - 1))),
        "drill.faults is a drill tool, accepted only with hyperparameters.max_steps under %d, got {value}"
        % DRILL_MAX_STEPS, subject="hyperparameters.max_steps"))
    for stage, runtime in (("deploy", base_images.SERVING_RUNTIME), ("prepare", base_images.PREPARE_RUNTIME),
                           ("evaluate", base_images.EVALUATION_RUNTIME)):
        if runtime not in built:
            found.append(rule("%s.runtime" % stage, Is("%s.enabled" % stage, True),
                              "%s needs the %s image, which this deployment does not build (runtimes: %s)"
                              % (stage, runtime, ", ".join(built))))
    return found



# ---- names the services restrict ----
# Read by the gate (`controlplane.gate`), `lmstack.start` and `stacks.settings`.
# SageMaker: EndpointName and TrainingJobName match ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$ (1-63 characters;
# botocore's sagemaker service model, shapes EndpointName and TrainingJobName). The execution name
# becomes a tag value (TagValue: ^([\p{L}\p{Z}\p{N}_.:/=+\-@]*)$) and a part of S3 keys (the
# checkpoint and TensorBoard prefixes; "Creating object key names", Amazon S3 user guide: letters,
# digits and - _ . are the safe characters). Step Functions itself allows execution names of 1-80
# characters with letters, digits and most punctuation ("StartExecution", Step Functions API reference).
ALPHANUMERIC = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
SAGEMAKER_NAME_MAX = 63
EXECUTION_NAME_MAX = 80
EXECUTION_NAME = "$$.Execution.Name"  # the path of the execution's own name (not part of the input)
# A training job's name: <prefix>-<token>-<MD5 of the execution ARN, 32 hex digits>-<attempt>.
JOB_NAME_HASH_LENGTH = 32


class NameRule(collections.namedtuple("NameRule", "name path label alphabet max_length alphanumeric_last describes")):
    """A name a service restricts: non-empty, only `alphabet` characters, at most `max_length`
    characters, a letter or digit last when `alphanumeric_last`. `path`: the dotted input path, or
    EXECUTION_NAME; `label`: what a message calls it; `describes`: the allowed form, for messages."""


def name_rules(name_prefix):
    """The names an execution gives to AWS resources, for a deployment whose names start with
    `name_prefix` (the endpoint is `<name_prefix>-<deploy.endpoint_name>`)."""
    endpoint_max = SAGEMAKER_NAME_MAX - len(name_prefix) - 1
    return [
        NameRule("deploy.endpoint_name", "deploy.endpoint_name", "deploy.endpoint_name", ALPHANUMERIC + "-",
                 endpoint_max, True, "letters, digits and hyphens, ending with a letter or digit, at most %d "
                 "characters (SageMaker endpoint names: 63 characters with %s- in front)" % (endpoint_max, name_prefix)),
        NameRule("execution.name", EXECUTION_NAME, "the execution name", ALPHANUMERIC + "-_", EXECUTION_NAME_MAX, False,
                 "letters, digits, - and _ (it becomes a tag value and a part of S3 keys)"),
    ]


def name_problem(found, value):
    """The message `found` (a NameRule) gives `value`, or None when the name is fine."""
    if isinstance(value, str) and value and len(value) <= found.max_length and all(
            char in found.alphabet for char in value) and (not found.alphanumeric_last or value[-1] in ALPHANUMERIC):
        return None
    return "%s must be %s, got %s" % (found.label, found.describes, json.dumps(value))


def job_name_length(name_prefix, token, max_attempts):
    """The length of the longest training job name the state machine builds (see NameRule)."""
    return len(name_prefix) + 1 + len(token) + 1 + JOB_NAME_HASH_LENGTH + 1 + len(str(max_attempts))
