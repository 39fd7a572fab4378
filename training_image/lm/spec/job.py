"""The tables the CDK app and the training image share: what a SageMaker job may be.

The strategies and the image variant each needs, the hyperparameters `lm.training.train` and
`lm.data.prepare` accept (name, type, bounds), the SMP v1 parameters, the metric log lines and
the regexes that read them. The request itself is built by `controlplane.request`; the names both
sides of a job must spell the same are in `lm.spec.contract`. The CDK app generates its state
machine from these tables; `lm.training.train` and `lm.data.prepare` build their argument parsers from them.

Pure Python 3.8, no TensorFlow: imported at synth time.
"""
import collections
import json
import math
import re

from lm.spec import contract
from lm.spec.conditions import INSTANCE_COUNT_FIELD, INSTANCE_TYPE_FIELD, STRATEGY_FIELD, Above, All, Is, Not, OneOf, broken, rule
from lm.spec.families import DEFAULT_FAMILY, FAMILIES, config_from_dict, family_rules
from lm.spec.fields import check, field

STRATEGIES = ("single", "mwms", "horovod", "smddp", "smp")
JOB_KINDS = {"train": "train.py", "prepare": "prepare.py"}
DLC_ACCOUNT = "763104351884"
DLC_REPOSITORY = "tensorflow-training"

# Image variants (facts page: which TF DLC carries which library). Key -> base image tag.
# tfcurrent: the TF 2.21 training DLC (released 2026-07-10, supported to 2027-07-10; tag from
# the AWS Deep Learning Containers release announcement): Amazon Linux 2023, CUDA 12.9, Keras 3
# only (no tf_keras, no Horovod), so the image adds tf_keras (training_image/Dockerfile).
# tf26 and tf211 are out of DLC support: they are kept only because SMP v1, SMDDP and Horovod
# for TensorFlow exist nowhere newer (docs/limits.md, "Support matrix": each image's support window).
RUNTIMES = collections.OrderedDict([
    ("tf26", "2.6.0-gpu-py38-cu112-ubuntu20.04"),
    ("tf211", "2.11.0-gpu-py39-cu112-ubuntu20.04-sagemaker"),
    ("tfcurrent", "2.21.0-gpu-py312-cu129-amzn2023-sagemaker"),
])
STRATEGY_RUNTIME = {"smp": "tf26", "smddp": "tf211", "horovod": "tf211", "mwms": "tfcurrent", "single": "tfcurrent"}
SERVING_RUNTIME = "tfcurrent"

SMDDP_INSTANCE_TYPES = ("ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge")
SMP_INSTANCE_TYPES = ("ml.g4dn.12xlarge", "ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge")
STRATEGY_INSTANCE_TYPES = {"smddp": SMDDP_INSTANCE_TYPES, "smp": SMP_INSTANCE_TYPES}

SMP_MPI_OPTIONS = "--mca btl_vader_single_copy_mechanism none"
SMP_DEFAULTS = collections.OrderedDict([
    ("partitions", 2), ("microbatches", 4), ("pipeline", "interleaved"), ("optimize", "speed"), ("horovod", True),
    # The placement lm.distributed.smp makes with smp.partition, which only manual partitioning keeps.
    ("auto_partition", False), ("default_partition", 0),
])
SMP_CHOICES = {"pipeline": ("simple", "interleaved"), "optimize": ("speed", "memory"),
               "placement_strategy": ("spread", "cluster")}


def base_image_uri(runtime, region):
    return "%s.dkr.ecr.%s.amazonaws.com/%s:%s" % (DLC_ACCOUNT, region, DLC_REPOSITORY, RUNTIMES[runtime])


# SageMaker's cap on StoppingCondition.MaxRuntimeInSeconds (28 days).
MAX_RUNTIME_SECONDS = 28 * 24 * 3600
# The job's own stop before MaxRuntimeInSeconds (hyperparameter stop_after_seconds): SageMaker stops a job there
# with SIGTERM and kills it about 120 s later, and its training toolkit does not forward SIGTERM to MPI
# workers, so the job stops itself first, with a checkpoint.
# MaxRuntime counts from the instances' start (billing starts there too: DescribeTrainingJob TrainingStartTime):
# the image pull and the toolkit come before the training process's clock starts. An allowance, not measured
# here (no account): a DLC image is several GB.
JOB_STARTUP_SECONDS = 600
# How fast a checkpoint is written to /opt/ml/checkpoints, an assumption: the job's ML storage volume is EBS,
# and gp2's throughput for a 100 GB volume (controlplane.request.VOLUME_SIZE_GB) is at most 128 MiB/s.
CHECKPOINT_WRITE_BYTES_PER_SECOND = 100 * 10 ** 6
SAVE_OVERHEAD_SECONDS = 30  # the snapshot, the file's rename and the ranks' barrier, beyond the bytes


def save_seconds(state_bytes):
    """How long a save of `state_bytes` of weights and optimizer state may take (the job's deadline allows it)."""
    return SAVE_OVERHEAD_SECONDS + int(math.ceil(state_bytes / float(CHECKPOINT_WRITE_BYTES_PER_SECOND)))


def stop_after_seconds(max_runtime_seconds):
    """The deadline a job with this MaxRuntimeInSeconds is given (0: none, when the start-up takes it all)."""
    return max(0, max_runtime_seconds - JOB_STARTUP_SECONDS)


def _hp(name, type_, default, minimum=None, maximum=None, choices=None, help="", **options):
    return field(name, type_, default, minimum, maximum, choices, help=help, **options)


# What `lm.training.train` accepts. The state machine's input validation is generated from this table.
HYPERPARAMETERS = collections.OrderedDict((hp.name, hp) for hp in [
    _hp("model", str, DEFAULT_FAMILY, choices=tuple(FAMILIES),
        help="model family (see lm.models); a preset's own when a preset is given and no model"),
    _hp("preset", str, "", help="the name of the model configuration (a preset of lm.spec.families): its configuration "
        "when model_config is not given, and the label of logs and MLflow"),
    # Filled by the control plane, never given in an execution input: the preset's configuration
    # (controlplane.presets), so the job runs the configuration it is sent, whatever presets its image holds.
    _hp("model_config", dict, None, nullable=True,
        help="the model's configuration: the fields of the model family's config (lm.spec.families), as a JSON object"),
    _hp("strategy", str, "single", choices=STRATEGIES, help="distribution strategy"),
    _hp("global_batch_size", int, 64, 1, 65536, help="sequences per optimizer step, all replicas together"),
    _hp("max_steps", int, 1000, 1, 10000000, help="optimizer steps"),
    _hp("learning_rate", float, 0.0, 0.0, 1.0,
        help="peak learning rate at GPT-3's batch for the model's size (0 = GPT-3's rate, Table 2.1; lm.spec.families)"),
    _hp("scale_lr", bool, False,
        help="scale learning_rate by the square root of global_batch_size / GPT-3's batch (Adam's rule), at most 1x; "
             "false keeps it whatever the batch"),
    _hp("min_lr_ratio", float, 0.1, 0.0, 1.0, help="final learning rate as a fraction of the peak"),
    _hp("warmup_steps", int, 100, 0, 10000000, help="linear warmup steps"),
    _hp("weight_decay", float, 0.1, 0.0, 1.0, help="AdamW decoupled weight decay"),
    _hp("grad_clip", float, 1.0, 0.0, 1000.0, help="global gradient norm clip (0 = off)"),
    _hp("dropout", float, 0.0, 0.0, 0.9, help="dropout rate"),
    _hp("precision", str, "auto", choices=("auto", "fp32", "fp16", "bf16"),
        help="auto: bf16 on Ampere and newer (A10G, A100, H100 ...), fp16 with loss scaling on V100/T4, fp32 on CPU"),
    _hp("xla", bool, True, help="compile the train step with XLA where it works"),
    _hp("recompute", bool, False, help="recompute activations in the backward pass"),
    _hp("seq_len", int, 0, 0, 65536, help="sequence length (0 = the dataset's)"),
    _hp("seed", int, 1234, 0, 2 ** 31 - 1, help="seed for weights and data order"),
    _hp("log_every", int, 10, 1, 1000000, help="steps between metric log lines"),
    _hp("eval_every", int, 500, 0, 10000000, help="steps between validation runs (0 = only at the end)"),
    _hp("eval_batches", int, 20, 1, 100000, help="batches per validation run"),
    _hp("checkpoint_every", int, 500, 0, 10000000, help="steps between checkpoints (0 = only on SIGTERM and at the end)"),
    _hp("checkpoint_minutes", float, 15.0, 0.0, 10080.0,
        help="minutes of training between checkpoints, what protects a spot run (0 = off)"),
    _hp("allow_new_data", bool, False,
        help="resume a checkpoint on a dataset other than the one it was trained on"),
    # Filled by the control plane, never given in an execution input (`stop_after_seconds` below).
    _hp("stop_after_seconds", int, 0, 0, MAX_RUNTIME_SECONDS,
        help="the job's deadline, in seconds from its start: stop training with a checkpoint after the last step "
             "that can finish and be saved before it, and end the job failed, saying so (0 = none)"),
    _hp("export_hf", bool, False,
        help="also write the Hugging Face files (lm.hf) into the export directory (families with hf_export)"),
])


def validate_hyperparameters(values, table=HYPERPARAMETERS):
    """Apply defaults and check every value; unknown names are an error. `table`: whose (train, prepare)."""
    unknown = sorted(set(values) - set(table))
    if unknown:
        raise ValueError("unknown hyperparameters %s; allowed: %s" % (", ".join(unknown), ", ".join(table)))
    merged = collections.OrderedDict()
    for name, spec in table.items():
        merged[name] = check(spec, values.get(name, spec.default), "hyperparameters.%s" % name)
    if table is HYPERPARAMETERS:
        if merged["model_config"] is not None:
            check_model_config(merged["model"], merged["model_config"])
        message = broken(job_rules(), {STRATEGY_FIELD: merged["strategy"], "hyperparameters": merged})
        if message:
            raise ValueError(message)
    return merged


def check_model_config(family, values):
    """The config of model `family` that the hyperparameter `model_config` holds; a ValueError naming
    the field otherwise."""
    try:
        return config_from_dict(family, values)
    except (ValueError, TypeError) as error:
        raise ValueError("hyperparameters.model_config is not a configuration of model %s: %s" % (family, error))


def encode_hyperparameters(values):
    """As the SDK's `EstimatorBase._json_encode_hyperparameters`: each value `json.dumps`-ed."""
    return collections.OrderedDict((str(key), json.dumps(value)) for key, value in values.items())


def decode_hyperparameter(raw):
    """As the container toolkit: `json.loads`, falling back to the raw string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def processes_per_host(strategy, gpus_per_host):
    """Horovod and SMP run one MPI process per GPU; the others one process per host."""
    return max(1, gpus_per_host) if strategy in ("horovod", "smp") else 1


# ---- metrics: the log lines `lm.training.train` prints and the regexes SageMaker reads them with ----

TRAIN_LOG_PREFIX = "[train]"
EVAL_LOG_PREFIX = "[eval]"
_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def format_train_log(step, loss, learning_rate, tokens_per_second, mfu, step_time):
    return "%s step=%d loss=%.4f lr=%.3e tokens_per_s=%.1f mfu=%.4f step_time=%.4f" % (
        TRAIN_LOG_PREFIX, step, loss, learning_rate, tokens_per_second, mfu, step_time)


def format_eval_log(step, val_loss):
    import math
    return "%s step=%d val_loss=%.4f val_ppl=%.3f" % (EVAL_LOG_PREFIX, step, val_loss, math.exp(min(val_loss, 50.0)))


METRIC_DEFINITIONS = [
    {"Name": "train:loss", "Regex": r"\[train\].* loss=" + _NUMBER},
    {"Name": "train:learning_rate", "Regex": r"\[train\].* lr=" + _NUMBER},
    {"Name": "train:tokens_per_second", "Regex": r"\[train\].* tokens_per_s=" + _NUMBER},
    {"Name": "train:mfu", "Regex": r"\[train\].* mfu=" + _NUMBER},
    {"Name": "train:step_time", "Regex": r"\[train\].* step_time=" + _NUMBER},
    {"Name": "validation:loss", "Regex": r"\[eval\].* val_loss=" + _NUMBER},
    {"Name": "validation:perplexity", "Regex": r"\[eval\].* val_ppl=" + _NUMBER},
    # lm.training.gpu_usage: the mean over a host's GPUs (SageMaker's GPUUtilization is their sum).
    {"Name": "gpu:utilization_per_gpu", "Regex": r"\[gpu\] utilization_per_gpu=" + _NUMBER},
]


def parse_metrics(line):
    """What SageMaker would extract from one log line: {metric name: value}."""
    found = {}
    for definition in METRIC_DEFINITIONS:
        match = re.search(definition["Regex"], line)
        if match:
            found[definition["Name"]] = float(match.group(1))
    return found


def validate_mp_parameters(values):
    """SMP v1 `mp_parameters` as the library reads them (SM_HP_MP_PARAMETERS): checked, with
    the library's own default of 1 microbatch. Unlisted keys are left to the library."""
    if not isinstance(values, dict):
        raise ValueError("mp_parameters must be a JSON object, got %r" % (values,))
    if "partitions" not in values:
        raise ValueError("mp_parameters.partitions is required (a positive integer)")
    checked = collections.OrderedDict(values)
    checked.setdefault("microbatches", 1)
    for name in ("partitions", "microbatches"):
        value = checked[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("mp_parameters.%s must be a positive integer, got %r" % (name, value))
    for name, choices in SMP_CHOICES.items():
        if name in checked:
            check(field(name, str, choices=choices), checked[name], "mp_parameters." + name)
    for name in ("horovod", "auto_partition"):
        if name in checked:
            check(field(name, bool), checked[name], "mp_parameters." + name)
    return checked


# ---- the "prepare" job: `lm.data.prepare` turning raw Pile files into token shards on EFS ----

# What `lm.data.prepare` accepts as a training job's hyperparameters (the toolkit passes them as
# `--name value`); `lm.data.prepare` builds its command line from this table.
PREPARE_HYPERPARAMETERS = collections.OrderedDict((hp.name, hp) for hp in [
    _hp("tokenizer", str, "", help="a tokenizers JSON file (a relative one is looked up in the raw channel)"),
    _hp("train_tokenizer", bool, False,
        help="train a byte-level BPE on a sample of the input (also done when no tokenizer and no init_from is given)"),
    _hp("vocab_size", int, 50257, 257, 2 ** 32, help="vocabulary size for train_tokenizer"),
    _hp("tokenizer_sample_bytes", int, 128 << 20, 1, 2 ** 40, help="text bytes train_tokenizer learns from"),
    _hp("eod_token", str, "<|endoftext|>", help="the end-of-document token written between documents"),
    _hp("seq_len", int, 2048, 1, 65536, help="tokens per record, plus one for the shifted target"),
    _hp("shard_size", int, 1 << 30, 1, 2 ** 40, help="bytes per shard file, rounded down to whole records"),
    _hp("val_fraction", float, 0.005, 0.0, 1.0, help="share of documents (by content hash) held out for validation"),
    _hp("workers", int, 0, 0, 4096, help="worker processes, one input file each (0 = one per core, <= files)"),
    _hp("threads", int, 0, 0, 4096, help="tokenizer threads per worker (0 = cores / workers)"),
    _hp("shard_index", int, -1, -1, 4095, help="this instance's share of the input files (-1 = from SM_HOSTS)"),
    _hp("num_shards", int, 0, 0, 4096, help="instances sharing the input files (0 = len(SM_HOSTS))"),
])
# The prepare settings that decide the bytes of the dataset (the tokenizer and how the token stream is
# cut and split); the others decide only how fast it is made. The state machine's dataset key holds them.
PREPARE_OUTPUT_HYPERPARAMETERS = ("tokenizer", "train_tokenizer", "vocab_size", "tokenizer_sample_bytes",
                                  "eod_token", "seq_len", "shard_size", "val_fraction")
PREPARE_INPUT_CHANNEL = contract.RAW_CHANNEL  # raw Pile files on EFS, read-only
PREPARE_OUTPUT_CHANNEL = contract.DATASET_CHANNEL  # the EFS dataset directory, mounted rw
PREPARE_RUNTIME = "tfcurrent"  # any image variant works: the job needs no GPU and no TensorFlow
# Tokenizing is CPU-bound; 72 vCPUs per instance. The whole Pile (30 files) in about an hour
# takes PREPARE_INSTANCE_COUNT of them (the estimate is in lm.data.prepare's docstring).
PREPARE_INSTANCE_TYPE = "ml.c5.18xlarge"
PREPARE_INSTANCE_COUNT = 5


# ---- what a job refuses, whoever asks: lm.training.train, the Validate stage, lmstack.start, the planner ----

def smp_recompute_rule():
    """SMP with activation recomputation cannot train: the ranks other than the one that traces the
    model import its serialized graph, and `tf.recompute_grad`'s gradient (a Python custom
    gradient) exists only in the tracing process, so their backward pass raises "LookupError: No
    gradient defined for operation"."""
    return rule("strategy.smp.recompute", All((Is(STRATEGY_FIELD, "smp"), Is("hyperparameters.recompute", True))),
                "hyperparameters.recompute must be false with strategy smp: the SMP ranks other than the tracing one "
                "import the traced graph, where the gradient of tf.recompute_grad is not defined (LookupError: No "
                "gradient defined for operation); controlplane.planner finds the partitions, microbatches and seq_len that fit "
                "without it")


def job_rules():
    """The rules between fields every job obeys (the deployment adds its own: `controlplane.rules`).
    Rules reading a path an input does not have are skipped (`conditions.broken`)."""
    found = list(family_rules())  # what each model family cannot do (its declared capabilities)
    for strategy, instance_types in STRATEGY_INSTANCE_TYPES.items():
        found.append(rule("strategy.%s.instance_type" % strategy,
                          All((Is(STRATEGY_FIELD, strategy), Not(OneOf(INSTANCE_TYPE_FIELD, instance_types)))),
                          "strategy %s runs only on instance_type %s (the SageMaker support list)"
                          % (strategy, ", ".join(instance_types))))
    found.append(smp_recompute_rule())
    found.append(rule("strategy.single.instance_count", All((Is(STRATEGY_FIELD, "single"),
                                                            Above(INSTANCE_COUNT_FIELD, 1))),
                      "strategy single runs on one instance, got instance_count={value}: set instance_count to 1 "
                      "or choose one of %s" % ", ".join(strategy for strategy in STRATEGIES if strategy != "single"),
                      subject=INSTANCE_COUNT_FIELD))
    return found
