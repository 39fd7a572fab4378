"""The training entrypoint: `python -m lm.train` (SageMaker runs it as `train.py`).

Hyperparameters are the ones in `lm.job.HYPERPARAMETERS`, given as `--name value` with
JSON-decoded values, as the SageMaker training toolkit passes them (`--max_steps 100`,
`--scale_lr false`, `--preset tiny`). Paths come from the SageMaker environment
(SM_CHANNEL_TRAIN, SM_MODEL_DIR, /opt/ml/checkpoints) or from `--data-dir`, `--export-dir`,
`--checkpoint-dir` on a laptop. A bad value exits non-zero with one readable line on stderr
and in SageMaker's failure file.

The loop: restore the newest complete checkpoint, then per step read this rank's slice of
the global batch (`lm.data`), run the strategy's train step, log every `log_every` steps
(`lm.job.format_train_log`), evaluate every `eval_every` steps and at the end
(`lm.job.format_eval_log`), checkpoint every `checkpoint_every` steps and every
`checkpoint_minutes` of training (the spot protection: on SageMaker SIGTERM may never reach
this process), at the end, and on SIGTERM (finish the step, save, exit 0). Rank 0 writes
TensorBoard scalars (`lm.summaries`) and exports the model at the end.
With LM_REPORT_WEIGHT_DIGEST=1 every rank prints a digest of its weights at the end, to
check that the replicas stayed in sync.
"""
import argparse
import hashlib
import json
import os
import random
import signal
import sys
import time

import numpy as np

from lm import checkpoint, contract, data, job, prices, shards, summaries
from lm.config import flops_per_token, get_preset

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
# GPUs newer than lm.prices' table, mapped to the row with the same peak figures.
GPU_ALIASES = {"H200": "H100"}


class UsageError(ValueError):
    """Bad input from the user: reported as one line, exit status 2."""


# ---- arguments and environment ----

def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m lm.train", description="Train a GPT on lm.shards token shards.",
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
    return parser


def decode_cli_value(spec, raw):
    """A command-line value as JSON, like the toolkit reads hyperparameters.json.

    The toolkit then writes each decoded value back with `str()` (sagemaker_training.mapping.
    to_cmd_args), so a boolean arrives as `True`/`False`, which is not JSON.
    """
    value = job.decode_hyperparameter(raw)
    if spec.type is bool and value in ("True", "False"):
        return value == "True"
    return value


def parse_args(argv=None):
    """(hyperparameters: validated OrderedDict, paths: argparse.Namespace)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        names = [item for item in unknown if item.startswith("-")] or unknown
        raise UsageError("unknown hyperparameters %s; allowed: %s"
                         % (", ".join(names), ", ".join(job.HYPERPARAMETERS)))
    given = {name: decode_cli_value(job.HYPERPARAMETERS[name], getattr(args, name))
             for name in job.HYPERPARAMETERS if getattr(args, name) is not None}
    hyperparameters = job.validate_hyperparameters(given)
    if not args.data_dir:
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


def failure_file():
    """SageMaker's failure file (output/failure), or None when not under SageMaker."""
    if os.environ.get("SM_OUTPUT_DATA_DIR"):
        return os.path.join(os.path.dirname(os.environ["SM_OUTPUT_DATA_DIR"].rstrip("/")), "failure")
    if os.environ.get("SAGEMAKER_BASE_DIR"):
        return os.path.join(os.environ["SAGEMAKER_BASE_DIR"], "output", "failure")
    return "/opt/ml/output/failure" if os.path.isdir("/opt/ml/output") else None


def report_failure(message):
    sys.stderr.write("lm.train: error: %s\n" % message)
    path = failure_file()
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shards.write_atomically(path, message + "\n")


# ---- devices and precision ----

def detect_gpu(tf):
    """The lm.prices name of the visible GPU (None on CPU or when unknown) and its compute capability."""
    gpus = tf.config.get_visible_devices("GPU")
    if not gpus:
        return None, None
    details = tf.config.experimental.get_device_details(gpus[0])
    device_name = details.get("device_name", "")
    for alias, name in GPU_ALIASES.items():
        if alias in device_name:
            return name, details.get("compute_capability")
    for name in prices.GPUS:
        if name in device_name:
            return name, details.get("compute_capability")
    return None, details.get("compute_capability")


def resolve_precision(requested, gpu, capability):
    if requested != "auto":
        return requested
    if gpu is not None:
        return prices.GPUS[gpu].default_precision
    if capability:
        return "bf16" if tuple(capability) >= (8, 0) else "fp16"
    return "fp32"


def peak_flops(gpu, precision):
    """Peak FLOP/s of one device at `precision`, or None where we have no figure (CPU)."""
    if gpu is None:
        return None
    return prices.GPUS[gpu].peak_flops.get(precision)


# ---- the run ----

class StopFlag:
    """Set by SIGTERM (SageMaker sends it before stopping a job or reclaiming a spot instance)."""

    def __init__(self):
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.requested = True


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
    config = get_preset(hp["preset"], family=hp["model"]).replace(dropout=hp["dropout"])
    source = shards.manifest_path(data_dir)
    if hp["seq_len"] and hp["seq_len"] != manifest.seq_len:
        raise UsageError("hyperparameters.seq_len is %d but the dataset's records hold %d tokens (%s); "
                         "use 0 or %d" % (hp["seq_len"], manifest.seq_len, source, manifest.seq_len))
    if manifest.seq_len > config.block_size:
        raise UsageError("%s: seq_len %d exceeds preset %s's context %d"
                         % (source, manifest.seq_len, hp["preset"], config.block_size))
    return config


def check_resume(meta, hp, path):
    for name in ("global_batch_size", "seed", "preset", "model"):
        if meta["hyperparameters"].get(name) != hp[name]:
            raise checkpoint.CheckpointError(
                "%s: was written with hyperparameters.%s=%r, this run has %r (use another --checkpoint-dir)"
                % (path, name, meta["hyperparameters"].get(name), hp[name]))


def run(hp, paths):
    from lm.compat import keras, tf
    from lm import distributed, models, optim

    strategy = distributed.get_strategy(hp["strategy"]).setup()
    # After setup: creating MultiWorkerMirroredStrategy installs TF's own SIGTERM handler, which
    # would replace ours and turn a spot interruption into a hard kill.
    stop = StopFlag()
    chief = strategy.is_chief

    def say(line):
        if chief:
            print(line, flush=True)

    manifest = shards.load_manifest(paths.data_dir)
    config = model_config(hp, manifest, paths.data_dir)
    train_stream = data.TokenStream(
        paths.data_dir, "train", global_batch_size=hp["global_batch_size"], dp_rank=strategy.data_parallel_rank,
        dp_size=strategy.data_parallel_size, seed=hp["seed"], seq_len=manifest.seq_len,
        vocab_size=config.vocab_size)
    eval_split = "val" if manifest.records("val") >= hp["global_batch_size"] else "train"
    if eval_split != "val":
        say("note: the dataset has no validation split of one global batch; evaluating on train data")
    eval_stream = data.TokenStream(
        paths.data_dir, eval_split, global_batch_size=hp["global_batch_size"], dp_rank=strategy.data_parallel_rank,
        dp_size=strategy.data_parallel_size, shuffle=False)
    eval_batches = min(hp["eval_batches"], eval_stream.steps_per_epoch)

    gpu, capability = detect_gpu(tf)
    precision = resolve_precision(hp["precision"], gpu, capability)
    policy = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}[precision]
    keras.mixed_precision.set_global_policy(policy)
    seed_everything(tf, hp["seed"])

    dropout_key = checkpoint.DropoutKey(hp["seed"], strategy.data_parallel_rank)
    model = strategy.build_model(lambda: dropout_key.attach(models.build(config, recompute=hp["recompute"])))
    peak_lr = optim.scaled_learning_rate(hp["learning_rate"], hp["global_batch_size"], hp["scale_lr"])

    def schedule(step):
        return optim.learning_rate_at(step, peak_lr, hp["warmup_steps"], hp["max_steps"], hp["min_lr_ratio"])

    with strategy.scope():
        optimizer = optim.AdamW(model.trainable_variables, schedule, weight_decay=hp["weight_decay"])
        loss_scale = optim.DynamicLossScale() if precision == "fp16" else None
    dropout_key.count_steps_of(optimizer.step)
    state = list(model.weights) + optimizer.variables + (loss_scale.variables if loss_scale else [])

    checkpoints = checkpoint.Checkpointer(paths.checkpoint_dir, tag=strategy.checkpoint_tag)
    fingerprint = shards.fingerprint(manifest)
    clock = checkpoint.SaveClock(hp["checkpoint_minutes"] * 60.0)
    tensorboard = summaries.Summaries(paths.tensorboard_dir, chief)
    step = 0
    latest = checkpoints.latest()
    if latest:
        meta = checkpoint.read_meta(latest)
        check_resume(meta, hp, latest)
        if checkpoint.check_dataset(meta, fingerprint, hp["allow_new_data"], latest):
            say("note: resuming %s on another dataset (allow_new_data)" % latest)
        checkpoint.restore(latest, state)
        step = meta["step"]
        say("resumed from %s at step %d (epoch %d, batch %d)" % ((latest, step) + train_stream.position(step)))

    loss_fn = token_loss(tf)

    def make_steps(jit):
        return (strategy.build_train_step(model, optimizer, loss_fn, grad_clip=hp["grad_clip"],
                                          loss_scale=loss_scale, jit_compile=jit),
                strategy.build_eval_step(model, loss_fn, jit_compile=jit))

    xla = hp["xla"]
    train_step, eval_step = make_steps(xla)

    def evaluate(at_step):
        batches = eval_stream.batches(0)
        total = 0.0
        for _ in range(eval_batches):
            inputs, labels = next(batches)
            total += float(eval_step(inputs, labels))
        batches.close()
        say(job.format_eval_log(at_step, total / eval_batches))
        tensorboard.validation(at_step, total / eval_batches)

    # Every rank must take the same save/barrier decisions: track the last checkpoint here rather
    # than look at the directory, where rank 0 may already have renamed it in place (a hang).
    saved = {"step": step if step else None}

    def save(at_step):
        saved["step"] = at_step
        clock.saved()
        if strategy.writes_checkpoints:
            epoch, batch = train_stream.position(at_step)
            checkpoints.save(at_step, state, {"hyperparameters": dict(hp), "epoch": epoch, "batch": batch,
                                              "config": config.to_dict(), "precision": precision,
                                              "dataset_fingerprint": fingerprint})
        strategy.barrier()

    say("training %s (%s, %s) with %s on %d device(s): %d steps of %d sequences x %d tokens, precision %s, xla %s"
        % (hp["preset"], hp["model"], "%.1fM params" % (model.count_params() / 1e6), strategy.name,
           strategy.devices, hp["max_steps"], hp["global_batch_size"], manifest.seq_len, precision, xla))
    flops = flops_per_token(config, manifest.seq_len)
    peak = peak_flops(gpu, precision)
    progress = keras.utils.Progbar(hp["max_steps"], stateful_metrics=["loss", "lr"]) if (
        chief and not paths.under_sagemaker and sys.stdout.isatty()) else None
    batches = train_stream.batches(step)
    window_losses, window_start, window_steps = [], time.time(), 0
    first_step_of_process = True
    stopped = False
    while step < hp["max_steps"]:
        inputs, labels = next(batches)
        if first_step_of_process:
            try:
                metrics = train_step(inputs, labels)
            except tf.errors.OpError as error:
                if not xla:
                    raise
                # XLA compiles on the first call, before any variable changes: retry without it.
                say("xla: the train step does not compile here (%s); running without XLA"
                    % str(error).strip().splitlines()[0])
                xla = False
                train_step, eval_step = make_steps(False)
                metrics = train_step(inputs, labels)
            strategy.broadcast_initial_state(model, optimizer)
            first_step_of_process = False
        else:
            metrics = train_step(inputs, labels)
        step += 1
        window_losses.append(metrics["loss"])
        window_steps += 1
        if step % hp["log_every"] == 0 or step == hp["max_steps"]:
            loss = float(tf.reduce_mean(tf.stack(window_losses)))
            elapsed = time.time() - window_start
            tokens_per_s = window_steps * train_stream.tokens_per_step / elapsed
            mfu = tokens_per_s * flops / (peak * strategy.devices) if peak else 0.0
            say(job.format_train_log(step, loss, float(schedule(step - 1)), tokens_per_s, mfu,
                                     elapsed / window_steps))
            tensorboard.train(step, loss=loss, learning_rate=float(schedule(step - 1)), tokens_per_s=tokens_per_s,
                              mfu=mfu, grad_norm=float(metrics["grad_norm"]), loss_scale=float(metrics["loss_scale"]))
            if progress:
                progress.update(step, [("loss", loss), ("lr", float(schedule(step - 1)))])
            window_losses, window_start, window_steps = [], time.time(), 0
            # Time-based checkpoints, at log windows: the ranks agree on the elapsed time first.
            if hp["checkpoint_minutes"] and step < hp["max_steps"] and clock.due(
                    float(strategy.allreduce_mean(clock.elapsed()))):
                save(step)
        if agree(strategy, stop.requested):
            save(step)
            say("SIGTERM: saved a checkpoint at step %d; exiting" % step)
            stopped = True
            break
        if hp["eval_every"] and step % hp["eval_every"] == 0 and step < hp["max_steps"]:
            evaluate(step)
        if hp["checkpoint_every"] and step % hp["checkpoint_every"] == 0 and step < hp["max_steps"] \
                and saved["step"] != step:
            save(step)
    batches.close()
    if stopped:
        checkpoints.wait()
        tensorboard.close()
        strategy.shutdown()
        return 0
    if saved["step"] != step:
        save(step)
    evaluate(step)
    if chief:
        from lm.export import export_model
        export_model(model, config, os.path.join(paths.data_dir, manifest.tokenizer_file), paths.export_dir)
        say("exported the model to %s" % paths.export_dir)
    checkpoints.wait()
    tensorboard.close()
    if os.environ.get("LM_REPORT_WEIGHT_DIGEST") == "1":
        sys.stderr.write("rank %d/%d weights sha256 %s\n" % (strategy.rank, strategy.size, weight_digest(model)))
    strategy.barrier()
    strategy.shutdown()
    return 0


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


def main(argv=None):
    try:
        hyperparameters, paths = parse_args(argv)
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
