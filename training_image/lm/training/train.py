"""The training entrypoint: `python -m lm.training.train` (SageMaker runs it as `train.py`).

Hyperparameters are the ones in `lm.spec.job.HYPERPARAMETERS`, given as `--name value` with
JSON-decoded values, as the SageMaker training toolkit passes them (`--max_steps 100`,
`--scale_lr false`, `--model_config '{"n_layer": 2, ...}'`). The model is built from `model_config`, the
configuration the control plane resolved from a preset (`controlplane.presets`), where `preset` only names it;
without one, from the preset itself (`lm.spec.families.with_preset`). Paths come from the SageMaker environment
(SM_CHANNEL_TRAIN, SM_MODEL_DIR, /opt/ml/checkpoints) or from `--data-dir`, `--export-dir`,
`--checkpoint-dir` on a laptop. A bad value exits non-zero with one readable line on stderr
and in SageMaker's failure file.

The loop: restore the newest complete checkpoint, then per step read this rank's slice of
the global batch (`lm.data.dataset`), run the strategy's train step, log every `log_every` steps
(`lm.spec.job.format_train_log`), evaluate every `eval_every` steps and at the end
(`lm.spec.job.format_eval_log`), checkpoint every `checkpoint_every` steps and every
`checkpoint_minutes` of training (the spot protection: on SageMaker SIGTERM may never reach
this process), at the end, and on SIGTERM (finish the step, save, exit 0). With a deadline
(`stop_after_seconds`, which the control plane sets below the job's MaxRuntimeInSeconds) every rank
stops after the last step it can finish and save before it, saves, and the job ends failed with a
reason that says so (exit status 3): SageMaker's own stop at MaxRuntime would kill MPI workers
without a save. Rank 0 writes
TensorBoard scalars (`lm.training.summaries`) and exports the model at the end.
With LM_REPORT_WEIGHT_DIGEST=1 every rank prints a digest of its weights at the end, to
check that the replicas stayed in sync.
"""
import argparse
import collections
import dataclasses
import hashlib
import json
import os
import random
import signal
import sys
import threading
import time

import numpy as np

from lm.spec import hardware
from lm import checkpoint
from lm.spec import contract
from lm.spec import drill
from lm.data import dataset
from lm.training import goodput
from lm.training import gpu_usage
from lm.spec import interruptions, job
from lm.spec import shards
from lm.training import divergence
from lm.training import summaries
from lm.training import tracking
from lm.spec import conditions
from lm.spec.families import PRESETS, flops_per_token, parameter_count, peak_learning_rate, with_preset

# SageMaker syncs this directory with CheckpointConfig.S3Uri (under SAGEMAKER_BASE_DIR when
# that is set, as in a local /opt/ml tree).
DEFAULT_CHECKPOINT_DIR = contract.CHECKPOINT_LOCAL_PATH
# Local paths when not under SageMaker.
LOCAL_CHECKPOINT_DIR = "checkpoints"
LOCAL_EXPORT_DIR = "model"
# Keys the SageMaker SDK adds to every job's hyperparameters that are not ours to act on:
# model_dir is the SDK's S3 location (SageMaker uploads SM_MODEL_DIR itself); SMP reads
# mp_parameters from SM_HP_MP_PARAMETERS.
SDK_PASSTHROUGH = ("model_dir", "mp_parameters")
# GPUs newer than controlplane.prices' table, mapped to the row with the same peak figures.
GPU_ALIASES = {"H200": "H100"}
# The job's clock (stop_after_seconds) counts from this process's start; the control plane allows for the
# job's start-up before it (controlplane.budget.JOB_STARTUP_SECONDS).
PROCESS_START = time.monotonic()
CLOCK = time.monotonic
# What SageMaker names the job in its container (the training toolkit reads it: sagemaker_training params.py,
# TRAINING_JOB_ENV): a restart of the same job (spot, RetryStrategy) carries the seconds it trained before.
JOB_NAME_ENVIRONMENT = "TRAINING_JOB_NAME"
EXIT_DEADLINE = 3  # the job stopped itself at its deadline, with a checkpoint
EXIT_DIVERGED = 4  # the job diverged more than max_rollbacks allows (lm.training.divergence)


class UsageError(ValueError):
    """Bad input from the user: reported as one line, exit status 2."""


# ---- hyperparameters ----

# One attribute per entry of lm.spec.job.HYPERPARAMETERS, in the table's order; built from the
# table so a new hyperparameter needs no second declaration here.
Hyperparameters = dataclasses.make_dataclass(
    "Hyperparameters", [(name, spec.type) for name, spec in job.HYPERPARAMETERS.items()], frozen=True,
    namespace={"__doc__": "lm.training.train's hyperparameters, validated once (`from_values`); read as attributes.",
               "from_values": classmethod(lambda cls, values: cls(**job.validate_hyperparameters(values))),
               "as_dict": lambda self: collections.OrderedDict(dataclasses.asdict(self))})


# ---- arguments and environment ----

def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m lm.training.train", description="Train a GPT on lm.spec.shards token shards.",
        epilog="Values are JSON (strings may be bare). SageMaker passes hyperparameters this way.")
    for name, spec in job.HYPERPARAMETERS.items():
        allowed = " (%s)" % ", ".join(spec.choices) if spec.choices else ""
        parser.add_argument("--" + name, dest=name, metavar="VALUE",
                            help="%s%s [default: %s]" % (spec.help, allowed, json.dumps(spec.default)))
    for name in SDK_PASSTHROUGH:
        parser.add_argument("--" + name, dest="sdk_" + name, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir",
                        default=os.environ.get(contract.channel_environment_variable(contract.TRAIN_CHANNEL)),
                        help="dataset directory with manifest.json [env SM_CHANNEL_TRAIN]")
    parser.add_argument("--init-from",
                        default=os.environ.get(contract.channel_environment_variable(contract.INIT_CHANNEL)),
                        help="start from the Hugging Face directory there (lm.hf; families with hf_import) [env SM_CHANNEL_INIT]")
    parser.add_argument("--export-dir", default=os.environ.get("SM_MODEL_DIR"),
                        help="where rank 0 exports the model [env SM_MODEL_DIR, else ./%s]" % LOCAL_EXPORT_DIR)
    parser.add_argument("--allow-new-data", dest="allow_new_data", action="store_const", const="true",
                        help="the same as --allow_new_data true")
    parser.add_argument("--tensorboard-dir", default=None,
                        help="TensorBoard scalars from rank 0 [%s under SageMaker, else none]"
                        % summaries.default_directory(True, {}))
    parser.add_argument("--checkpoint-dir", default=os.environ.get("LM_CHECKPOINT_DIR"),
                        help="checkpoints [env LM_CHECKPOINT_DIR; %s under SageMaker, else ./%s]"
                        % (DEFAULT_CHECKPOINT_DIR, LOCAL_CHECKPOINT_DIR))
    dry = parser.add_argument_group("--dry-run", "check what the runtime checks before step 1, then exit 0 "
                                    "(or 2 with the problem) without training")
    dry.add_argument("--dry-run", action="store_true", help="validate only")
    dry.add_argument("--instance-type", default=sagemaker_instance_type(),
                     help="the job's instance type [env SM_CURRENT_INSTANCE_TYPE]")
    dry.add_argument("--instance-count", type=int, default=len(json.loads(os.environ.get("SM_HOSTS", '["algo-1"]'))),
                     help="the job's instance count [env SM_HOSTS]")
    return parser


def sagemaker_instance_type():
    """SM_CURRENT_INSTANCE_TYPE, or None where it names no instance: the training toolkit writes
    "local" when the resource config has no current_instance_type (sagemaker_training.environment),
    as under the SDK's local mode and the demo's local hosts, whose hardware no rule can judge."""
    name = os.environ.get("SM_CURRENT_INSTANCE_TYPE")
    return None if name in (None, "local", "local_gpu") else name


def decode_cli_value(spec, raw):
    """A command-line value as JSON, like the toolkit reads hyperparameters.json.

    The toolkit then writes each decoded value back with `str()` (sagemaker_training.mapping.
    to_cmd_args), so a boolean arrives as `True`/`False`, which is not JSON.
    """
    value = job.decode_hyperparameter(raw)
    if spec.type is bool and value in ("True", "False"):
        return value == "True"
    if spec.type is dict and isinstance(value, str):
        # An object sent as JSON text (model_config), which the toolkit passes on as it is: an
        # object it would write as k=v pairs.
        return job.decode_hyperparameter(value)
    return value


def parse_args(argv=None):
    """(hyperparameters: validated `Hyperparameters`, paths: argparse.Namespace)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        names = [item for item in unknown if item.startswith("-")] or unknown
        raise UsageError("unknown hyperparameters %s; allowed: %s"
                         % (", ".join(names), ", ".join(job.HYPERPARAMETERS)))
    given = {name: decode_cli_value(job.HYPERPARAMETERS[name], getattr(args, name))
             for name in job.HYPERPARAMETERS if getattr(args, name) is not None}
    hyperparameters = Hyperparameters.from_values(with_preset(given))
    if hyperparameters.model_config is None:
        raise UsageError("hyperparameters.model_config is required: the configuration of model %s as a JSON object, "
                         "or a hyperparameters.preset (one of %s)" % (hyperparameters.model, ", ".join(PRESETS)))
    check_job_rules(hyperparameters, args)
    if not args.data_dir and not args.dry_run:
        raise UsageError("no dataset: pass --data-dir or set SM_CHANNEL_TRAIN")
    under_sagemaker = "SM_MODEL_DIR" in os.environ
    if not args.export_dir:
        args.export_dir = LOCAL_EXPORT_DIR
    if not args.checkpoint_dir:
        base = os.environ.get("SAGEMAKER_BASE_DIR")
        args.checkpoint_dir = (os.path.join(base, "checkpoints") if base else DEFAULT_CHECKPOINT_DIR) \
            if under_sagemaker else LOCAL_CHECKPOINT_DIR
    args.under_sagemaker = under_sagemaker
    if not args.tensorboard_dir:
        args.tensorboard_dir = summaries.default_directory(under_sagemaker)
    return hyperparameters, args


def check_job_rules(hp, args):
    """The rules every job obeys (`lm.spec.job.job_rules`) over what the hyperparameters alone cannot
    say, so `job.validate_hyperparameters` skipped them: the instance type and count this job runs on
    (SageMaker's resource config, or --instance-type/--instance-count in a dry run) and init_from (a
    family that reads the Hugging Face layout)."""
    given = {conditions.STRATEGY_FIELD: hp.strategy, "hyperparameters": hp.as_dict(), "init_from": args.init_from,
             conditions.INSTANCE_COUNT_FIELD: args.instance_count}
    if args.instance_type:
        hardware.get_instance(args.instance_type)  # an unknown type is named with the known ones first
        given[conditions.INSTANCE_TYPE_FIELD] = args.instance_type
    message = conditions.broken(job.job_rules(), given)
    if message:
        raise UsageError(message)


def failure_file():
    """SageMaker's failure file (output/failure), or None when not under SageMaker."""
    if os.environ.get("SM_OUTPUT_DATA_DIR"):
        return os.path.join(os.path.dirname(os.environ["SM_OUTPUT_DATA_DIR"].rstrip("/")), "failure")
    if os.environ.get("SAGEMAKER_BASE_DIR"):
        return os.path.join(os.environ["SAGEMAKER_BASE_DIR"], "output", "failure")
    return "/opt/ml/output/failure" if os.path.isdir("/opt/ml/output") else None


def report_failure(message):
    sys.stderr.write("lm.training.train: error: %s\n" % message)
    path = failure_file()
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shards.write_atomically(path, message + "\n")


# ---- devices and precision ----

def detect_gpu(tf):
    """The controlplane.prices name of the visible GPU (None on CPU or when unknown) and its compute capability."""
    gpus = tf.config.get_visible_devices("GPU")
    if not gpus:
        return None, None
    details = tf.config.experimental.get_device_details(gpus[0])
    device_name = details.get("device_name", "")
    for alias, name in GPU_ALIASES.items():
        if alias in device_name:
            return name, details.get("compute_capability")
    for name in hardware.GPUS:
        if name in device_name:
            return name, details.get("compute_capability")
    return None, details.get("compute_capability")


def resolve_precision(requested, gpu, capability):
    return requested if requested != "auto" else hardware.auto_precision(gpu, capability)


def peak_flops(gpu, precision):
    """Peak FLOP/s of one device at `precision`, or None where we have no figure (CPU)."""
    if gpu is None:
        return None
    return hardware.GPUS[gpu].peak_flops.get(precision)


# ---- the run ----

class StopFlag:
    """Set by SIGTERM (SageMaker sends it before stopping a job or reclaiming a spot instance)."""

    def __init__(self):
        self.requested = False
        # Only the main thread may install handlers (and receives signals); test fakes run
        # ranks as threads.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.requested = True


class JobClock:
    """The seconds this job has trained: this process's, plus what an earlier process of the same job (a spot
    restart, SageMaker's retry after an internal error: MaxRuntimeInSeconds counts all of them) recorded in the
    checkpoint it resumes from. The time between that checkpoint and the interruption, and each restart's
    start-up, are not counted: the deadline's margin does not cover them (docs/execution.md)."""

    def __init__(self, job_name, clock=None, start=None):
        self.job_name = job_name
        self.clock = clock or CLOCK
        self.start = PROCESS_START if start is None else start
        self.carried = 0.0

    def seconds(self):
        return self.carried + self.clock() - self.start

    def record(self):
        return {"name": self.job_name, "seconds": self.seconds()}

    def resume(self, meta):
        """Carry the seconds of the checkpoint `meta` when the same job wrote it."""
        recorded = meta.get("job") or {}
        if self.job_name and recorded.get("name") == self.job_name:
            self.carried = float(recorded.get("seconds", 0.0))


def seed_everything(tf, seed):
    """Keras initializers without a seed draw theirs from Python's and NumPy's generators too."""
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)


def token_loss(tf):
    def loss(labels, logits):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.cast(logits, tf.float32)))
    return loss


def model_config(hp, manifest, data_dir):
    config = job.check_model_config(hp.model, hp.model_config).replace(dropout=hp.dropout)
    source = shards.manifest_path(data_dir)
    if hp.seq_len and hp.seq_len != manifest.seq_len:
        raise UsageError("hyperparameters.seq_len is %d but the dataset's records hold %d tokens (%s); "
                         "use 0 or %d" % (hp.seq_len, manifest.seq_len, source, manifest.seq_len))
    if manifest.seq_len > config.block_size:
        raise UsageError("%s: seq_len %d exceeds model_config.block_size %d (preset %s)"
                         % (source, manifest.seq_len, config.block_size, hp.preset))
    return config


def init_from_config(hp, preset_config, manifest, paths):
    """init_from: the checkpoint's config, whose shape must be the preset's; the dataset must be
    tokenized with the checkpoint's tokenizer."""
    from lm import hf

    if hp.strategy == "smp":
        raise UsageError("init_from is not supported with strategy smp (its model is partitioned across ranks)")
    config = hf.init_config(paths.init_from, preset_config, "preset %s" % hp.preset)
    hf.check_same_tokenizer(paths.init_from, os.path.join(paths.data_dir, manifest.tokenizer_file))
    if manifest.seq_len > config.block_size:
        raise UsageError("%s: seq_len %d exceeds the checkpoint's context %d (n_positions)"
                         % (shards.manifest_path(paths.data_dir), manifest.seq_len, config.block_size))
    return config


def check_resume(meta, hp, path):
    for name in ("global_batch_size", "seed", "preset", "model", "model_config"):
        if meta["hyperparameters"].get(name) != getattr(hp, name):
            raise checkpoint.CheckpointError(
                "%s: was written with hyperparameters.%s=%r, this run has %r (%s)"
                % (path, name, meta["hyperparameters"].get(name), getattr(hp, name), checkpoint.OTHER_CHECKPOINTS))


class Training:
    """One run of `lm.training.train`: `Training(hp, paths)` sets up, `loop()` trains, `finish()` ends.

    Setup builds the strategy, data streams, model, optimizer and steps and restores the newest
    checkpoint; `loop()` runs `train_one` then `after_step` per step until max_steps or an agreed
    stop; `finish()` saves, evaluates, exports (chief) and releases the strategy. Every rank takes
    the same save/barrier decisions: `saved_step` tracks the last checkpoint rather than the
    directory, where rank 0 may already have renamed it in place (a hang).
    """

    def __init__(self, hp, paths):
        from lm.compat import keras, tf

        self.hp, self.paths, self.tf, self.keras = hp, paths, tf, keras
        self._setup_strategy()
        self._setup_data()
        self._setup_precision()
        self._setup_model()
        self._setup_optimizer()
        self._setup_checkpoints()
        self._setup_tracking()
        self.step = self.restore()
        self.saved_step = self.step if self.step else None
        self._setup_steps()

    # -- setup, in the order __init__ calls them --

    def _setup_strategy(self):
        """The distribution strategy, the SIGTERM flag and the job's clock."""
        from lm import distributed

        self.strategy = distributed.get_strategy(self.hp.strategy).setup()
        # After setup: creating MultiWorkerMirroredStrategy installs TF's own SIGTERM handler, which
        # would replace ours and turn a spot interruption into a hard kill.
        self.stop = StopFlag()
        self.job_clock = JobClock(os.environ.get(JOB_NAME_ENVIRONMENT))
        self.deadline_reached = False
        self.chief = self.strategy.is_chief

    def _setup_data(self):
        """The manifest, the model config it allows, and this rank's train and eval streams."""
        hp, paths, strategy = self.hp, self.paths, self.strategy
        manifest = self.manifest = shards.load_manifest(paths.data_dir)
        config = self.config = model_config(hp, manifest, paths.data_dir)
        if paths.init_from:
            config = self.config = init_from_config(hp, config, manifest, paths)
        self.train_stream = dataset.TokenStream(
            paths.data_dir, "train", global_batch_size=hp.global_batch_size, dp_rank=strategy.data_parallel_rank,
            dp_size=strategy.data_parallel_size, seed=hp.seed, seq_len=manifest.seq_len,
            vocab_size=config.vocab_size)
        eval_split = "val" if manifest.records("val") >= hp.global_batch_size else "train"
        if eval_split != "val":
            self.say("note: the dataset has no validation split of one global batch; evaluating on train data")
        self.eval_stream = dataset.TokenStream(
            paths.data_dir, eval_split, global_batch_size=hp.global_batch_size, dp_rank=strategy.data_parallel_rank,
            dp_size=strategy.data_parallel_size, shuffle=False)
        self.eval_batches = min(hp.eval_batches, self.eval_stream.steps_per_epoch)

    def _setup_precision(self):
        """The GPU, the precision it resolves to (Keras' policy) and the seeds."""
        from lm import compat

        self.gpu, capability = detect_gpu(self.tf)
        self.precision = resolve_precision(self.hp.precision, self.gpu, capability)
        policy = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}[self.precision]
        compat.set_precision_policy(policy)  # of either Keras: SMP's model is on TensorFlow's bundled one
        seed_everything(self.tf, self.hp.seed)

    def _setup_model(self):
        """The strategy's model, with its dropout key, and init_from's weights."""
        from lm import models

        hp, paths, config = self.hp, self.paths, self.config
        self.dropout_key = checkpoint.DropoutKey(hp.seed, self.strategy.data_parallel_rank)
        self.model = self.strategy.build_model(
            lambda **options: self.dropout_key.attach(models.build(config, recompute=hp.recompute, **options)))
        if paths.init_from:  # a checkpoint of this run, if any, replaces these weights in restore()
            from lm import hf
            hf.load_weights(self.model, paths.init_from)
            self.say("initialized the weights from the Hugging Face checkpoint in %s" % paths.init_from)

    def _setup_optimizer(self):
        """The learning-rate schedule, AdamW, fp16's loss scale, and the state a checkpoint holds."""
        from lm.training import optim

        hp = self.hp
        self.learning_rate_at = optim.learning_rate_at
        self.peak_lr = peak_learning_rate(self.config, hp.global_batch_size, hp.learning_rate, hp.scale_lr)
        faults = os.environ.get(drill.FAULTS_ENVIRONMENT)
        with self.strategy.scope():
            self.faults = divergence.Faults(self.tf, faults) if faults else None  # a drill's
            schedule = self.faults.schedule(self.schedule) if self.faults else self.schedule
            self.optimizer = optim.AdamW(self.model.trainable_variables, schedule, weight_decay=hp.weight_decay)
            self.loss_scale = optim.DynamicLossScale() if self.precision == "fp16" else None
        self.dropout_key.count_steps_of(self.optimizer.step)
        self.state = (list(self.model.weights) + self.optimizer.variables
                      + (self.loss_scale.variables if self.loss_scale else []))
        # How long a save of this rank's state may take (the deadline leaves room for one).
        self.save_seconds = job.save_seconds(sum(int(variable.shape.num_elements()) * variable.dtype.size
                                                 for variable in self.state))

    def _setup_checkpoints(self):
        """The strategy's checkpoints, the dataset's fingerprint they record, and the time-based save clock."""
        self.checkpoints = self.strategy.checkpoints(self.paths.checkpoint_dir)
        self.fingerprint = shards.fingerprint(self.manifest)
        hp = self.hp
        self.ledger = goodput.Ledger(self.job_clock.job_name, self.train_stream.tokens_per_step,
                                     self.paths.checkpoint_dir, PROCESS_START)
        self.auto_interval = None
        self.step_interval = hp.checkpoint_every
        if hp.checkpoint_every == interruptions.AUTO:
            hosts = self.paths.instance_count
            self.auto_interval = goodput.AutoInterval(self.save_seconds, hp.interruption_hours, hosts,
                                                      max(1, self.strategy.devices // hosts), hp.checkpoint_minutes)
            self.step_interval = 0
            self.say(self.auto_interval.described("planned from the checkpoint's size"))
        self.clock = checkpoint.SaveClock(self.auto_interval.seconds() if self.auto_interval
                                          else hp.checkpoint_minutes * 60.0)
        self.divergence = divergence.Divergence(self.hp)
        self.diverged = None  # the failure reason once the run diverged past max_rollbacks

    def _setup_tracking(self):
        """TensorBoard scalars, and MLflow when enabled, from the chief."""
        hp = self.hp
        self.tensorboard = summaries.Summaries(self.paths.tensorboard_dir, self.chief, tracker=tracking.start(
            hp.as_dict(), {"dataset_fingerprint": self.fingerprint, "preset": hp.preset}, self.say) if self.chief else None)

    def _setup_steps(self):
        """The compiled train and eval steps (XLA unless it fails to compile on the first step)."""
        self.loss_fn = self.faults.loss(token_loss(self.tf)) if self.faults else token_loss(self.tf)
        self.xla = self.hp.xla
        self.train_step, self.eval_step = self.make_steps(self.xla)
        self.first_step_of_process = True

    # -- setup helpers --

    def say(self, line):
        if self.chief:
            print(line, flush=True)

    def data_position(self, step):
        """The data stream's position (batches from the start) after `step` steps: rollbacks skip windows."""
        return step + self.divergence.data_offset

    def schedule(self, step):
        hp = self.hp
        return self.learning_rate_at(step, self.peak_lr, hp.warmup_steps, hp.max_steps, hp.min_lr_ratio)

    def restore(self):
        """The step of rank 0's newest complete checkpoint, restored into `state` on every rank; 0 when
        there is none.

        Rank 0 chooses and the strategy sends its choice to every rank, whose own directory (its host's)
        must hold that checkpoint. A rank without it fails, and so does every other rank, at once,
        rather than waiting for it in the first collective."""
        strategy, checkpoints = self.strategy, self.checkpoints
        chosen = strategy.choose_checkpoint(checkpoints.newest_step())
        if chosen is None:
            return 0
        latest = checkpoints.where(chosen)
        present = checkpoints.has(chosen)
        lacking = 0 if strategy.size == 1 else int(round(
            float(strategy.allreduce_mean(0.0 if present else 1.0)) * strategy.size))
        if not present:
            raise checkpoint.CheckpointError("%s: not found on rank %d, but the run resumes from step %d (rank 0's "
                                             "newest checkpoint)" % (latest, strategy.rank, chosen))
        if lacking:
            raise checkpoint.CheckpointError("the checkpoint of step %d (rank 0's newest) is missing on %d of %d ranks; "
                                             "they name the path" % (chosen, lacking, strategy.size))
        meta = checkpoints.read_meta(chosen)
        check_resume(meta, self.hp, latest)
        self.ledger.resumed(meta, meta["step"])
        self.job_clock.resume(meta)
        self.divergence.resume(meta)
        if checkpoint.check_dataset(meta, self.fingerprint, self.hp.allow_new_data, latest):
            self.say("note: resuming %s on another dataset (allow_new_data)" % latest)
        checkpoints.restore(chosen, self.state)
        step = meta["step"]
        self.say("resumed from %s at step %d (epoch %d, batch %d)"
                 % ((latest, step) + self.train_stream.position(self.data_position(step))))
        return step

    def make_steps(self, jit):
        return (self.strategy.build_train_step(self.model, self.optimizer, self.loss_fn, grad_clip=self.hp.grad_clip,
                                               loss_scale=self.loss_scale, jit_compile=jit),
                self.strategy.build_eval_step(self.model, self.loss_fn, jit_compile=jit))

    # -- actions every rank takes together --

    def evaluate(self, at_step):
        started = time.monotonic()
        batches = self.eval_stream.batches(0)
        total = 0.0
        for _ in range(self.eval_batches):
            inputs, labels = next(batches)
            total += float(self.eval_step(inputs, labels))
        batches.close()
        self.say(job.format_eval_log(at_step, total / self.eval_batches))
        self.tensorboard.validation(at_step, total / self.eval_batches)
        self.ledger.evaluated(time.monotonic() - started)

    def save(self, at_step):
        started = time.monotonic()
        self.saved_step = at_step
        self.clock.saved()
        self.ledger.commit()
        epoch, batch = self.train_stream.position(self.data_position(at_step))
        # On every rank: the strategy's checkpoints know which ranks write.
        self.checkpoints.save(at_step, self.state, {
            "hyperparameters": self.hp.as_dict(), "epoch": epoch, "batch": batch,
            "config": self.config.to_dict(), "precision": self.precision,
            "dataset_fingerprint": self.fingerprint, "job": self.job_clock.record(),
            "goodput": self.ledger.record(at_step), "divergence": self.divergence.record()})
        self.strategy.barrier()
        self.after_save(at_step, time.monotonic() - started)

    def after_save(self, at_step, seconds):
        """The save's time in the ledger; with checkpoint_every auto, the interval re-planned after the first
        (every rank with the ranks' mean time, so that all keep the same clock)."""
        self.ledger.saved(seconds)
        if self.auto_interval and not self.auto_interval.measured:
            self.auto_interval.first_save(float(self.strategy.allreduce_mean(seconds)))
            self.clock.interval_seconds = self.auto_interval.seconds()
            self.say(self.auto_interval.described("measured at the first save"))
        self.say(job.format_checkpoint_log(at_step, seconds, self.clock.interval_seconds))
        self.log_goodput(at_step)

    def log_goodput(self, step):
        """The ledger's totals as the metric definitions read them, and as TensorBoard and MLflow scalars."""
        totals = self.ledger.totals(step)
        self.say(job.format_goodput_log(totals))
        self.tensorboard.goodput(step, totals)

    # -- the loop --

    def train_one(self, inputs, labels):
        """One optimizer step; the first of this process may fall back from XLA, then broadcasts state."""
        if not self.first_step_of_process:
            return self.train_step(inputs, labels)
        try:
            metrics = self.train_step(inputs, labels)
        except self.tf.errors.OpError as error:
            if not self.xla:
                raise
            # XLA compiles on the first call, before any variable changes: retry without it.
            self.say("xla: the train step does not compile here (%s); running without XLA"
                     % str(error).strip().splitlines()[0])
            self.xla = False
            self.train_step, self.eval_step = self.make_steps(False)
            metrics = self.train_step(inputs, labels)
        self.strategy.broadcast_initial_state(self.model, self.optimizer)
        self.first_step_of_process = False
        return metrics

    def log_window(self, metrics):
        """The train log line (and TensorBoard, progress bar) over the steps since the last one."""
        hp, step = self.hp, self.step
        loss = float(self.tf.reduce_mean(self.tf.stack(self.window_losses)))
        elapsed = time.time() - self.window_start
        window_steps = len(self.window_losses)
        tokens_per_s = window_steps * self.train_stream.tokens_per_step / elapsed
        mfu = tokens_per_s * self.flops / (self.peak * self.strategy.devices) if self.peak else 0.0
        learning_rate = float(self.schedule(step - 1))
        self.say(job.format_train_log(step, loss, learning_rate, tokens_per_s, mfu, elapsed / window_steps))
        self.tensorboard.train(step, loss=loss, learning_rate=learning_rate, tokens_per_s=tokens_per_s,
                               mfu=mfu, grad_norm=float(metrics["grad_norm"]), loss_scale=float(metrics["loss_scale"]))
        if self.progress:
            self.progress.update(step, [("loss", loss), ("lr", learning_rate)])
        self.window_losses, self.window_start = [], time.time()
        # Time-based checkpoints, at log windows: the ranks agree on the elapsed time first.
        if self.clock.interval_seconds and step < hp.max_steps and self.clock.due(
                float(self.strategy.allreduce_mean(self.clock.elapsed()))):
            self.save(step)

    def past_deadline(self, step_seconds):
        """Whether another step of `step_seconds` and a save of this rank's state would end after
        stop_after_seconds (0: no deadline)."""
        if not self.hp.stop_after_seconds or self.step >= self.hp.max_steps:
            return False
        return self.job_clock.seconds() + step_seconds + self.save_seconds >= self.hp.stop_after_seconds

    def deadline_message(self):
        """The job's failure reason when it stopped at its deadline."""
        return ("stopped at step %d of %d at stop_after_seconds %d (MaxRuntimeInSeconds less the job's start-up, "
                "from max_runtime_seconds or budget_usd): the checkpoint of step %d is saved; give the run more time "
                "or budget to finish" % (self.step, self.hp.max_steps, self.hp.stop_after_seconds, self.step))

    def after_step(self, metrics, step_seconds=0.0):
        """Per-step hook, after `self.step` was counted (`step_seconds`: how long it took): log, stop vote, eval,
        checkpoint.

        Returns True when every rank agreed to stop (SIGTERM on any rank, or the deadline on any rank).
        """
        hp, step = self.hp, self.step
        self.window_losses.append(metrics["loss"])
        if step % hp.log_every == 0 or step == hp.max_steps:
            self.log_window(metrics)
        deadline = self.past_deadline(step_seconds)
        if agree(self.strategy, self.stop.requested or deadline):
            self.save(step)
            self.deadline_reached = agree(self.strategy, deadline)
            self.say("%s: saved a checkpoint at step %d; exiting" % (
                "stop_after_seconds" if self.deadline_reached else "SIGTERM", step))
            return True
        if hp.eval_every and step % hp.eval_every == 0 and step < hp.max_steps:
            self.evaluate(step)
        if self.step_interval and step % self.step_interval == 0 and step < hp.max_steps \
                and self.saved_step != step:
            self.save(step)
        return False

    def loop(self):
        """Train until max_steps; True when stopped early by an agreed SIGTERM or the deadline."""
        hp = self.hp
        self.say("training %s (%s, %s) with %s on %d device(s): %d steps of %d sequences x %d tokens, precision %s, "
                 "xla %s" % (hp.preset, hp.model, "%.1fM params" % (parameter_count(self.config) / 1e6),
                             self.strategy.name, self.strategy.devices, hp.max_steps, hp.global_batch_size,
                             self.manifest.seq_len, self.precision, self.xla))
        self.flops = flops_per_token(self.config, self.manifest.seq_len)
        self.peak = peak_flops(self.gpu, self.precision)
        self.progress = self.keras.utils.Progbar(hp.max_steps, stateful_metrics=["loss", "lr"]) if (
            self.chief and not self.paths.under_sagemaker and sys.stdout.isatty()) else None
        batches = self.train_stream.batches(self.data_position(self.step))
        self.window_losses, self.window_start = [], time.time()
        stopped = False
        step_seconds = 0.0  # the last step's, for the deadline: not the process's first (it compiles)
        while self.step < hp.max_steps:
            started, compiling = time.monotonic(), self.first_step_of_process
            inputs, labels = next(batches)
            if self.faults:
                self.faults.before(self.step + 1, self.divergence.fresh)
            metrics = self.train_one(inputs, labels)
            self.step += 1
            step_seconds = step_seconds if compiling else time.monotonic() - started
            if divergence.defend(self, metrics):  # rolled back: the stream goes on after the skipped window
                batches.close()
                if self.diverged:
                    return True
                batches = self.train_stream.batches(self.data_position(self.step))
                self.window_losses = []
                continue
            stopped = self.after_step(metrics, step_seconds)
            self.account_step()
            if stopped:
                break
        batches.close()
        return stopped

    def account_step(self):
        """The step's time in the ledger; its start line after the process's first step, its progress beside
        the checkpoints at every log window."""
        first = not self.ledger.started
        self.ledger.step_done()
        if first:
            self.say(self.ledger.start_line())
        if self.chief and self.step % self.hp.log_every == 0:
            self.ledger.write_progress(self.step)

    def finish(self, stopped):
        """After the loop: the last save, evaluation and export (unless stopped), then release."""
        if not stopped:
            if self.saved_step != self.step:
                self.save(self.step)
            self.evaluate(self.step)
            whole_model = self.strategy.whole_model(self.model)
            if self.chief:
                from lm.serving.export import export_model
                export_model(whole_model, self.config, os.path.join(self.paths.data_dir, self.manifest.tokenizer_file),
                             self.paths.export_dir)
                self.say("exported the model to %s" % self.paths.export_dir)
                if self.hp.export_hf:
                    from lm.serving import export
                    from lm import hf
                    hf.write_hf(whole_model, self.config, os.path.join(self.paths.export_dir, export.TOKENIZER_FILE),
                                self.paths.export_dir)
                    self.say("wrote the Hugging Face files next to it (export_hf)")
        self.ledger.ended()
        self.log_goodput(self.step)
        self.checkpoints.wait()
        divergence.log(self, "summary", self.step, "at the end of this process")  # the final metrics' counts
        self.tensorboard.close()
        if stopped:
            self.strategy.shutdown()
            if self.diverged:
                report_failure(self.diverged)
                return EXIT_DIVERGED
            if self.deadline_reached:
                report_failure(self.deadline_message())
                return EXIT_DEADLINE
            return 0
        if os.environ.get("LM_REPORT_WEIGHT_DIGEST") == "1":
            sys.stderr.write("rank %d/%d weights sha256 %s\n"
                             % (self.strategy.rank, self.strategy.size, weight_digest(self.model)))
        self.strategy.barrier()
        self.strategy.shutdown()
        return 0


def run(hp, paths):
    """Train with validated `Hyperparameters` `hp`; the exit status."""
    gpu_usage.start()  # the per-GPU utilization line of this host, for the low-GPU alarm
    training = Training(hp, paths)
    return training.finish(training.loop())


def weight_digest(model):
    """sha256 over every weight's bytes: equal on all ranks iff the replicas are in sync."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def agree(strategy, requested):
    """True on every rank once any rank got SIGTERM, so all ranks stop after the same step."""
    if strategy.size == 1:
        return requested
    return float(strategy.allreduce_mean(1.0 if requested else 0.0)) > 0.0


# ---- --dry-run ----

def data_parallel_layout(hp, instance_type, instance_count, mp_parameters):
    """(data-parallel ranks, GPUs that split one rank's share) the strategy starts on this layout,
    checking what the strategy's `setup` and first step check (lm.distributed)."""
    from lm.spec import hardware
    from lm.distributed import smp

    if instance_type is None:
        raise UsageError("--dry-run needs --instance-type (or SM_CURRENT_INSTANCE_TYPE)")
    gpus = max(hardware.get_instance(instance_type).gpus, 1)
    if hp.strategy == "single":
        if instance_count != 1:
            raise UsageError("strategy single runs on one instance, got --instance-count %d" % instance_count)
        return 1, 1
    if hp.strategy == "mwms":
        return instance_count, gpus  # one TokenStream rank per worker, split over its GPUs
    processes = instance_count * (gpus if hp.strategy == "smddp" else job.processes_per_host(hp.strategy, gpus))
    if hp.strategy != "smp":
        return processes, 1
    mp = job.validate_mp_parameters(json.loads(mp_parameters) if isinstance(mp_parameters, str) else mp_parameters)
    if processes % mp["partitions"]:
        raise UsageError("mp_parameters.partitions=%d does not divide the %d processes (%d x %s)"
                         % (mp["partitions"], processes, instance_count, instance_type))
    replicas = processes // mp["partitions"]
    problem = (smp.horovod_problem(mp, replicas, processes)
               or smp.microbatch_problem(mp, hp.global_batch_size // replicas, replicas) or smp.placement_problem(mp))
    if problem:
        raise UsageError(problem)
    return replicas, 1


def dry_run(hp, paths):
    """Everything Training checks before step 1 that needs no GPU and no cluster: the layout
    (`data_parallel_layout`), the split of the global batch over the ranks (lm.data.dataset.TokenStream's
    rule) and over a worker's GPUs, and with a dataset (--data-dir) the manifest, the model config,
    both streams as Training opens them and the newest checkpoint's compatibility."""
    from lm import distributed
    from lm.distributed import mwms

    mp_parameters = paths.sdk_mp_parameters or os.environ.get("SM_HP_MP_PARAMETERS")
    if hp.strategy == "smp" and not mp_parameters:
        raise UsageError("strategy smp needs mp_parameters (--mp_parameters JSON or SM_HP_MP_PARAMETERS)")
    ranks, local = data_parallel_layout(hp, paths.instance_type, paths.instance_count, mp_parameters)
    if hp.global_batch_size % ranks:
        raise UsageError("global_batch_size (%d) must be divisible by the data-parallel size (%d)"
                         % (hp.global_batch_size, ranks))
    problem = mwms.local_split_problem(hp.global_batch_size // ranks, ranks, local)
    if problem:
        raise UsageError(problem)
    checked = "layout and batch"
    if paths.data_dir:
        manifest = shards.load_manifest(paths.data_dir)
        config = model_config(hp, manifest, paths.data_dir)
        for split in ("train", "val" if manifest.records("val") >= hp.global_batch_size else "train"):
            dataset.TokenStream(paths.data_dir, split, global_batch_size=hp.global_batch_size, dp_size=ranks,
                             seq_len=manifest.seq_len, vocab_size=config.vocab_size)
        # The newest checkpoint as the strategy keeps them (constructing an adapter starts nothing).
        checkpoints = distributed.get_strategy(hp.strategy).checkpoints(paths.checkpoint_dir)
        newest = checkpoints.newest_step()
        latest = None if newest is None else checkpoints.where(newest)
        if latest:
            meta = checkpoints.read_meta(newest)
            check_resume(meta, hp, latest)
            checkpoint.check_dataset(meta, shards.fingerprint(manifest), hp.allow_new_data, latest)
        checked += ", dataset %s%s" % (paths.data_dir, ", checkpoint %s" % latest if latest else "")
    print("lm.training.train --dry-run: ok (%s): %s on %d x %s, %d data-parallel rank(s) of %d sequences"
          % (checked, hp.strategy, paths.instance_count, paths.instance_type, ranks, hp.global_batch_size // ranks))
    return 0


def main(argv=None):
    try:
        hyperparameters, paths = parse_args(argv)
        if paths.dry_run:
            return dry_run(hyperparameters, paths)
        return run(hyperparameters, paths)
    except (UsageError, shards.ShardError, checkpoint.CheckpointError) as error:
        report_failure(str(error))
        return 2
    except ValueError as error:  # validate_hyperparameters: names the field and the allowed values
        report_failure(str(error))
        return 2
    except Exception as error:
        report_failure("%s: %s" % (type(error).__name__, error))
        raise


if __name__ == "__main__":
    sys.exit(main())
