"""The tables the CDK app and the training image share: what a SageMaker job may be.

The strategies and the instance types their libraries run on, the hyperparameters `lm.training.train`
and `lm.data.prepare` accept (name, type, bounds), the SMP v1 parameters' check, the metric log lines
and the rules every job obeys. The request itself is built by `controlplane.request`; the names both
sides of a job must spell the same are in `lm.spec.contract`. What only the control plane reads (the
image variants, the regexes SageMaker reads the log with, the job's start-up allowance) is in
`controlplane`: editing it rebuilds no image. The CDK app generates its state
machine from these tables; `lm.training.train` and `lm.data.prepare` build their argument parsers from them.

Pure Python 3.8, no TensorFlow: imported at synth time.
"""
import collections
import json
import math

from lm.spec import contract
from lm.spec.conditions import INSTANCE_COUNT_FIELD, INSTANCE_TYPE_FIELD, STRATEGY_FIELD, Above, All, Is, Not, OneOf, broken, rule
from lm.spec.families import DEFAULT_FAMILY, FAMILIES, capability_message, config_from_dict
from lm.spec.fields import check, field

STRATEGIES = ("single", "mwms", "horovod", "smddp", "smp")

SMDDP_INSTANCE_TYPES = ("ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge")
SMP_INSTANCE_TYPES = ("ml.g4dn.12xlarge", "ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge")
STRATEGY_INSTANCE_TYPES = {"smddp": SMDDP_INSTANCE_TYPES, "smp": SMP_INSTANCE_TYPES}

SMP_CHOICES = {"pipeline": ("simple", "interleaved"), "optimize": ("speed", "memory"),
               "placement_strategy": ("spread", "cluster")}


# SageMaker's cap on StoppingCondition.MaxRuntimeInSeconds (28 days).
MAX_RUNTIME_SECONDS = 28 * 24 * 3600
# How fast a checkpoint is written to /opt/ml/checkpoints, an assumption: the job's ML storage volume is EBS,
# and gp2's throughput for a 100 GB volume (controlplane.request.VOLUME_SIZE_GB) is at most 128 MiB/s.
CHECKPOINT_WRITE_BYTES_PER_SECOND = 100 * 10 ** 6
SAVE_OVERHEAD_SECONDS = 30  # the snapshot, the file's rename and the ranks' barrier, beyond the bytes


def save_seconds(state_bytes):
    """How long a save of `state_bytes` of weights and optimizer state may take (the job's deadline allows it)."""
    return SAVE_OVERHEAD_SECONDS + int(math.ceil(state_bytes / float(CHECKPOINT_WRITE_BYTES_PER_SECOND)))


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
        help="peak learning rate (0 = the rate GPT-3 trained the model's size with, Table 2.1; lm.spec.families), used "
             "at any global_batch_size unless scale_lr"),
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
    _hp("checkpoint_every", int, "auto", 0, 10000000, words=("auto",),
        help="steps between checkpoints (0 = only on SIGTERM and at the end); auto: every Young/Daly interval of "
             "training, from the save's time and interruption_hours (lm.spec.interruptions)"),
    _hp("checkpoint_minutes", float, 15.0, 0.0, 10080.0,
        help="minutes of training between checkpoints, what protects a spot run (0 = off)"),
    _hp("interruption_hours", float, 0.0, 0.0, 1000000.0,
        help="mean hours between interruptions of one instance, for checkpoint_every auto (0 = the default for "
             "spot or on demand, lm.spec.interruptions)"),
    _hp("allow_new_data", bool, False,
        help="resume a checkpoint on a dataset other than the one it was trained on"),
    # Filled by the control plane, never given in an execution input (`controlplane.budget.stop_after_seconds`).
    _hp("stop_after_seconds", int, 0, 0, MAX_RUNTIME_SECONDS,
        help="the job's deadline, in seconds from its start: stop training with a checkpoint after the last step "
             "that can finish and be saved before it, and end the job failed, saying so (0 = none)"),
    _hp("export_hf", bool, False,
        help="also write the Hugging Face files (lm.hf) into the export directory (families with hf_export)"),
    # The divergence defense (lm.training.divergence; docs/execution.md).
    _hp("spike_detection", bool, True,
        help="roll back to the checkpoint before a loss spike and skip the data that led to it"),
    _hp("spike_window", int, 100, 16, 100000, help="steps whose median and spread the loss is judged against"),
    _hp("spike_threshold", float, 6.0, 1.0, 1000.0,
        help="a loss above the median by this many spreads (1.4826 x the median absolute deviation) is high"),
    _hp("spike_steps", int, 3, 1, 1000, help="high-loss steps in a row that make a spike"),
    _hp("nonfinite_limit", int, 3, 1, 1000,
        help="non-finite steps in a row (each skipped, not applied) that roll back"),
    _hp("rollback_skip", int, 200, 0, 10000000,
        help="batches skipped from the rollback checkpoint's data position (at least up to the spike's batch)"),
    _hp("max_rollbacks", int, 3, 0, 1000,
        help="rollbacks a run may make; one more saves and ends the job failed, naming the steps"),
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


def decode_hyperparameter(raw):
    """As the container toolkit: `json.loads`, falling back to the raw string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def processes_per_host(strategy, gpus_per_host):
    """Horovod and SMP run one MPI process per GPU; the others one process per host."""
    return max(1, gpus_per_host) if strategy in ("horovod", "smp") else 1


# ---- metrics: the log lines `lm.training.train` prints (SageMaker reads them with controlplane.metrics) ----

TRAIN_LOG_PREFIX = "[train]"
EVAL_LOG_PREFIX = "[eval]"


def format_train_log(step, loss, learning_rate, tokens_per_second, mfu, step_time):
    return "%s step=%d loss=%.4f lr=%.3e tokens_per_s=%.1f mfu=%.4f step_time=%.4f" % (
        TRAIN_LOG_PREFIX, step, loss, learning_rate, tokens_per_second, mfu, step_time)


DIVERGENCE_LOG_PREFIX = "[divergence]"


def format_divergence_log(event, step, epoch, batch, skipped_steps, rollbacks, detail):
    """A skipped step or a rollback, with the run's counts so far (lm.training.divergence)."""
    return "%s %s step=%d epoch=%d batch=%d skipped_steps=%d rollbacks=%d %s" % (
        DIVERGENCE_LOG_PREFIX, event, step, epoch, batch, skipped_steps, rollbacks, detail)


def format_eval_log(step, val_loss):
    import math
    return "%s step=%d val_loss=%.4f val_ppl=%.3f" % (EVAL_LOG_PREFIX, step, val_loss, math.exp(min(val_loss, 50.0)))


GOODPUT_LOG_PREFIX = "[goodput]"
CHECKPOINT_LOG_PREFIX = "[checkpoint]"
# Where a job's time went, cumulative over its processes (a spot restart continues the counts), as of the line:
# the chief logs it at every save and at the end, so a job's last values (SageMaker's FinalMetricDataList)
# stand whether it completed, failed or was stopped (lm.training.goodput).
GOODPUT_TOTALS = ("kept_steps", "kept_tokens", "trained_tokens", "redone_steps", "kept_step_seconds",
                  "startup_seconds", "save_seconds", "eval_seconds", "redone_seconds", "end_seconds",
                  "process_seconds")
# At each start of the job's process: whether and where it resumed, and the steps an interruption lost.
GOODPUT_START = ("resumed", "resumed_from_step", "steps_lost", "process_startup_seconds")


def _pairs(names, values):
    return " ".join("%s=%s" % (name, ("%d" % values[name]) if isinstance(values[name], int) else
                               "%.3f" % values[name]) for name in names)


def format_goodput_log(totals):
    """The goodput totals line: `totals` holds every name of GOODPUT_TOTALS."""
    return "%s %s" % (GOODPUT_LOG_PREFIX, _pairs(GOODPUT_TOTALS, totals))


def format_goodput_start_log(start):
    """The line at a process's first step: `start` holds every name of GOODPUT_START."""
    return "%s start %s" % (GOODPUT_LOG_PREFIX, _pairs(GOODPUT_START, start))


def format_checkpoint_log(step, save_seconds, interval_seconds):
    """A save: how long it held training, and the interval to the next (0: none by time)."""
    return "%s step=%d save_seconds=%.3f interval_seconds=%.1f" % (CHECKPOINT_LOG_PREFIX, step, save_seconds,
                                                                  interval_seconds)


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
PREPARE_INPUT_CHANNEL = contract.RAW_CHANNEL  # raw Pile files on EFS, read-only
PREPARE_OUTPUT_CHANNEL = contract.DATASET_CHANNEL  # the EFS dataset directory, mounted rw


# ---- what a job refuses, whoever asks: lm.training.train, the Validate stage, lmstack.start, the planner ----

MODEL_FIELD = "hyperparameters.model"
# capability (lm.spec.families.CAPABILITIES) -> (what an input asks that needs it, the condition on the
# input that asks it). A capability without an entry (kv_cache) is not asked by an input: its consumer
# reads the declaration.
ASKED_BY = collections.OrderedDict([
    ("smp", ("strategy smp", Is(STRATEGY_FIELD, "smp"))),
    ("recompute", ("hyperparameters.recompute true", Is("hyperparameters.recompute", True))),
    ("hf_export", ("hyperparameters.export_hf true", Is("hyperparameters.export_hf", True))),
    ("hf_import", ("init_from (a Hugging Face checkpoint)", Not(Is("init_from", None)))),
    ("tgi", ("deploy.container tgi", All((Is("deploy.enabled", True), Is("deploy.container", "tgi"))))),
    ("lmi", ("deploy.container lmi", All((Is("deploy.enabled", True), Is("deploy.container", "lmi"))))),
])


def family_rules():
    """One rule per family and capability it lacks that an input can ask for. Rules reading a
    path an input does not have are skipped (`conditions.broken`): lm.training.train's
    hyperparameters have no deploy or init_from, so it checks init_from itself."""
    found = []
    for name, family in FAMILIES.items():
        for capability, (asked, when) in ASKED_BY.items():
            if not family.supports(capability):
                found.append(rule("family.%s.%s" % (name, capability), All((Is(MODEL_FIELD, name), when)),
                                  capability_message(name, asked, capability)))
    return found


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


def smp_dropout_rule():
    """SMP with dropout would not resume to the run it continues: the model draws its masks from the
    dropout key lm.training.train attaches to the model (lm.checkpoint.DropoutKey, a function of the
    seed and the step), but SMP builds its graph from a tracing copy it constructs from the model's
    constructor arguments (smdistributed/modelparallel/tensorflow/v2/model.py, lines 62-64), which
    never gets the key and draws from TensorFlow's global generator instead."""
    return rule("strategy.smp.dropout", All((Is(STRATEGY_FIELD, "smp"), Above("hyperparameters.dropout", 0))),
                "hyperparameters.dropout must be 0 with strategy smp, got {value}: SMP traces a copy of the model that "
                "does not draw its dropout masks from the run's seed and step, so a resumed run would not continue "
                "the interrupted one; train with dropout under single, horovod, mwms or smddp",
                subject="hyperparameters.dropout")


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
    found.append(smp_dropout_rule())
    found.append(rule("strategy.single.instance_count", All((Is(STRATEGY_FIELD, "single"),
                                                            Above(INSTANCE_COUNT_FIELD, 1))),
                      "strategy single runs on one instance, got instance_count={value}: set instance_count to 1 "
                      "or choose one of %s" % ", ".join(strategy for strategy in STRATEGIES if strategy != "single"),
                      subject=INSTANCE_COUNT_FIELD))
    return found
