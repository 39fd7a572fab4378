"""The execution input: its fields, their types, bounds, choices and defaults.

`schema(settings)` is what an execution may hold, with a deployment's defaults (`settings`: any object
with the attributes it reads, `stacks.settings.Settings` or the gate's `controlplane.gate.Deployment`).
The gate (`controlplane.gate.check_fields`) checks an input against it, whoever asks: the state machine's
Validate state and `lmstack.start`. A new input field is one `Field` here (docs/fork.md).

Pure Python, no TensorFlow: shipped in the gate's Lambda function.
"""
import collections
import dataclasses

from controlplane import bucket_layout
from controlplane import containers, presets, request
from lm.spec import drill, job
from lm.spec.fields import Field, check
from lm.spec.hardware import INSTANCES
from controlplane.containers import HOSTING_INSTANCE_TYPES

MAX_INSTANCE_COUNT = 64
MAX_RUNTIME_SECONDS = job.MAX_RUNTIME_SECONDS
FALLBACK_FIELD = "fallback_instance_types"
# Each instance type gets MAX_ATTEMPTS attempts (stacks.state_machine.jobs); a job's name holds the attempt.
MAX_FALLBACK_INSTANCE_TYPES = 3


def _from_table(table, skip=()):
    return tuple(spec for name, spec in table.items() if name not in skip)


def _mp_fields():
    fields = []
    for name, default in request.SMP_DEFAULTS.items():
        kind = type(default)
        fields.append(Field(name, kind, default, minimum=(0 if name == "default_partition" else 1) if kind is int else None,
                            choices=job.SMP_CHOICES.get(name)))
    return tuple(fields)


# The prepare job's instance type: tokenizing is CPU-bound, 72 vCPUs per instance; the whole Pile (30 files)
# in about an hour takes 5 of them (the estimate is in lm.data.prepare's docstring).
PREPARE_INSTANCE_TYPE = "ml.c5.18xlarge"
# Top-level fields that are hyperparameters too: given once, at the top.
TOP_LEVEL_HYPERPARAMETERS = ("preset", "strategy")
# Hyperparameters the machine fills itself, from the gate's plan (`controlplane.gate`): model_config is the
# preset's configuration (`controlplane.presets`), stop_after_seconds the job's deadline (`controlplane.budget`).
RESOLVED_HYPERPARAMETERS = ("model_config", "stop_after_seconds")
DEFAULT_ENDPOINT_INSTANCE_TYPE = "ml.g5.xlarge"
MODEL_ARTIFACT = "model_artifact"  # deploy.model_artifact: serve an existing model, train nothing
# What a deploy-only input may give besides deploy: the preset (the model the artifact holds) and its family.
DEPLOY_ONLY_FIELDS = ("preset", "deploy", "hyperparameters.model")


# The gate accepts an input's drill.faults only with hyperparameters.max_steps below this: a drill, not a real run
# (controlplane.rules).
DRILL_MAX_STEPS = 1000


def input_hyperparameters(defaults=()):
    """The hyperparameters an execution input may give (`lm.spec.job.HYPERPARAMETERS` less the top-level and the
    resolved ones), with `defaults` ((name, value) pairs: the deployment's default_hyperparameters) as defaults."""
    overrides = dict(defaults)
    return tuple(dataclasses.replace(spec, default=overrides[spec.name]) if spec.name in overrides else spec
                 for spec in _from_table(job.HYPERPARAMETERS, skip=TOP_LEVEL_HYPERPARAMETERS + RESOLVED_HYPERPARAMETERS))


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
        # CreateTrainingJob, the gate checks the ARN's start).
        Field("training_plan_arn", str, None, prefix="arn:aws", nullable=True,
              help="run on the reserved capacity of this SageMaker training plan (its ARN)"),
        Field("data_directory", str, settings.dataset_directory, prefix="/",
              help="dataset directory on the EFS file system (manifest.json and shards)"),
        Field("hyperparameters", dict, fields=input_hyperparameters(settings.default_hyperparameters),
              help="overrides of lm.training.train's hyperparameters (the deployment's default_hyperparameters "
                   "setting first)"),
        Field("mp_parameters", dict, fields=_mp_fields(), help="SMP v1 parameters (strategy smp)"),
        Field("prepare", dict, fields=(
            Field("enabled", bool, False, help="run lm.data.prepare into data_directory before training"),
            Field("force", bool, False, help="run it even when a prepare job already completed for this dataset"),
            Field("raw_s3_uri", str, None, prefix="s3://", nullable=True,
                  help="raw Pile files under this S3 prefix (null: raw_directory on EFS)"),
            Field("raw_directory", str, "/raw", prefix="/",
                  help="raw Pile files on the EFS file system, when raw_s3_uri is null"),
            Field("instance_type", str, PREPARE_INSTANCE_TYPE, choices=instance_types),
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
            Field("budget_hours", float, 0.0, 0.0, None,
                  help="hours of the endpoint that budget_usd counts (0: its hourly price is stated, not budgeted)"),
            Field("container", str, containers.DEFAULT_CONTAINER, choices=containers.CONTAINERS,
                  help="lmstack (lm.serving.server), tgi (Text Generation Inference) or lmi (LMI, vLLM) on the Hugging Face export"),
            Field(MODEL_ARTIFACT, str, None, prefix="s3://", nullable=True,
                  help="serve this model without training: a training job's model.tar.gz in the artifact bucket "
                       "(s3://<bucket>/%s<job>/output/model.tar.gz), or for tgi and lmi a Hugging Face directory "
                       "under s3://<bucket>/%s; no prepare or training job runs" % (bucket_layout.OUTPUT_PREFIX,
                                                                                   bucket_layout.INIT_PREFIX)),
        )),
        Field("init_from", str, None, prefix="s3://", nullable=True,
              help="start from a Hugging Face checkpoint directory (config.json, safetensors weights, "
                   "tokenizer.json) of a family that reads that layout (GPT-2, Llama), under this S3 prefix "
                   "(s3://<artifact bucket>/%s<name>/)" % bucket_layout.INIT_PREFIX),
        Field("resume_from", str, None, nullable=True,
              help="continue the checkpoints of an earlier execution of this stack: the name its failure "
                   "output gives (s3://<artifact bucket>/%s<name>/)" % bucket_layout.CHECKPOINT_PREFIX),
        Field("mlflow_experiment", str, settings.name_prefix,
              help="MLflow experiment of the run, with the mlflow_resource_arn setting (letters, digits, - _ . /)"),
        Field("min_quality", float, None, 0.0, None, nullable=True,
              help="deploy only if the final validation loss is at most this"),
        Field("budget_usd", float, None, 0.01, None, nullable=True,
              help="the most the run's jobs may cost, in USD: refused when its estimate is more, else the training "
                   "job's MaxRuntimeInSeconds is capped to it (controlplane.budget); the endpoint counts for deploy.budget_hours"),
        Field("drill", dict, fields=(
            Field("faults", str, None, nullable=True,
                  help="a divergence drill: LMSTACK_FAULTS for the training job (%s); only with "
                       "hyperparameters.max_steps under %d (docs/execution.md)" % (drill.FORMS, DRILL_MAX_STEPS)),
        )),
        # Checked by `controlplane.gate.check_fallback_instance_types` (a Field has no list type).
        Field(FALLBACK_FIELD, object, (),
              help="instance types to train on, in this order, when instance_type has no capacity after its "
                   "retries (each gets its own plan); at most %d" % MAX_FALLBACK_INSTANCE_TYPES),
    )


def unknown_message(label, allowed):
    return "%s has an unknown field; allowed: %s" % (label, ", ".join(allowed))


def check_object(fields, value, prefix=""):
    """Check a whole (nested) input object against `fields`: unknown names and every value."""
    known = collections.OrderedDict((spec.name, spec) for spec in fields)
    unknown = [name for name in value if name not in known]
    if unknown:
        raise ValueError("%s; got %s" % (unknown_message(prefix[:-1] or "the input", known), ", ".join(
            prefix + name for name in unknown)))
    for name, item in value.items():
        spec = known[name]
        check(spec, item, prefix + name)
        if spec.type is dict:
            check_object(spec.fields, item, prefix + name + ".")


def defaults(fields):
    """The input every field's default makes."""
    return collections.OrderedDict(
        (spec.name, defaults(spec.fields) if spec.type is dict else spec.default) for spec in fields)


def with_defaults(fields, given):
    """A checked input merged over the defaults (nested objects field by field)."""
    def merge(base, overrides):
        for key, value in overrides.items():
            if isinstance(base.get(key), dict):
                merge(base[key], value)
            else:
                base[key] = value
        return base
    return merge(defaults(fields), given)
