"""How long a checkpoint save stalls training: background write against a synchronous one.

    python bench/checkpoint.py [--layers 4] [--d-model 512] [--heads 8] [--seq-len 128] [--batch 4]
                               [--vocab 8192] [--steps 12] [--save-every 4] [--repeats 3]
                               [--interval-minutes 15]

In one process, the `lm.distributed.single` train step (AdamW, clipping) runs `--steps` steps
three ways, in turn, `--repeats` times (medians reported, so a busy machine slows all alike):

- `none`: no checkpoint: the step time;
- `sync`: `lm.checkpoint.Checkpointer(background=False).save` every `--save-every` steps, the
  write (.npz, fsync, rename) on the training thread;
- `background-copy`: the snapshot lm.checkpoint took before: the training thread copies every
  variable to host memory (`np.array(variable.numpy())`), a thread writes while the next steps
  run;
- `background`: lm.checkpoint's snapshot: one tf.function reads every variable (no copy; the
  next step's updates copy on write), a thread moves the tensors to host memory and writes.

The stall of one save is the time the save call blocks (after the previous write ended, as
it has at lm.train's minutes-long cadence) plus, for each step that runs while
the background write is in flight, its time beyond the median of the steps that ran alone
(what the writer thread takes from training: CPU cores, memory bandwidth). It is reported
per save, as a fraction of one step, and spread over one time-based checkpoint interval
(`--interval-minutes`, lm.train's `checkpoint_minutes`): the share of training time the
periodic checkpoints cost. The target: a save stalls training by at most 2 % of one step.
Also reported: the first save's call (it reads eagerly while the read function is traced)
and the CPU time of each write on its own thread. Prints a table and JSON; writes
bench/results/checkpoint.json.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training_image"))

from publish import publish  # noqa: E402

from lm import checkpoint  # noqa: E402
from lm.compat import TF_VERSION, tf  # noqa: E402
from lm.config import GPTConfig, parameter_count  # noqa: E402
from lm.distributed import get_strategy  # noqa: E402
from lm.model import build_model  # noqa: E402
from lm.optim import AdamW, learning_rate_at  # noqa: E402
from lm.train import token_loss  # noqa: E402

TARGET_FRACTION_OF_STEP = 0.02
MODES = ("none", "sync", "background-copy", "background")


class TimedWrites:
    """Records the CPU time each write takes on its own thread: what it can take from training."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.write_cpu_s = []

    def _write(self, *args):
        started = time.thread_time()
        try:
            return super()._write(*args)
        finally:
            self.write_cpu_s.append(time.thread_time() - started)


class Checkpointer(TimedWrites, checkpoint.Checkpointer):
    pass


class CopyingCheckpointer(TimedWrites, checkpoint.Checkpointer):
    """lm.checkpoint's earlier snapshot: a host copy of every variable, made on the training thread."""

    def _snapshot(self, variables):
        return [np.array(variable.numpy()) for variable in variables]


def make_saver(mode, directory):
    if mode == "none":
        return None
    if mode == "background-copy":
        return CopyingCheckpointer(directory)
    return Checkpointer(directory, background=mode == "background")


def run(saver, step, state, tokens, steps, save_every):
    """This saver's stall per save: the save calls plus, for each step that ran beside a
    background write, its time beyond the median of the steps that ran alone."""
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    alone, beside, calls = [], [], []
    for index in range(1, steps + 1):
        writing = saver is not None and saver.writing()
        started = time.perf_counter()
        float(step(inputs, labels)["loss"])
        (beside if writing else alone).append(time.perf_counter() - started)
        if saver and index % save_every == 0 and index < steps:
            # Saves come minutes apart in training, long after the last write ended; here they
            # come --save-every steps apart, so the previous write is waited for untimed.
            saver.wait()
            started = time.perf_counter()
            saver.save(index, state, {"bench": True})
            calls.append(time.perf_counter() - started)
    if saver:
        saver.wait()
    step_seconds = statistics.median(alone)
    stall = (sum(calls) + sum(max(0.0, seconds - step_seconds) for seconds in beside)) / len(calls) if calls else 0.0
    return {"seconds_per_step": step_seconds, "stall_per_save_s": stall,
            "save_call_s": statistics.median(calls) if calls else 0.0, "steps_beside_a_write": len(beside)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--interval-minutes", type=float, default=15.0)
    parser.add_argument("--directory", help="where checkpoints are written (default: a temporary directory)")
    args = parser.parse_args(argv)

    config = GPTConfig(n_layer=args.layers, d_model=args.d_model, n_head=args.heads, block_size=args.seq_len,
                       vocab_size=args.vocab, pad_vocab_to=64)
    tf.random.set_seed(0)
    model = build_model(config)
    optimizer = AdamW(model.trainable_variables, lambda step: learning_rate_at(step, 1e-3, 10, 1000, 0.1))
    step = get_strategy("single").setup().build_train_step(model, optimizer, token_loss(tf), grad_clip=1.0)
    state = list(model.weights) + optimizer.variables
    state_bytes = sum(int(variable.shape.num_elements()) * variable.dtype.size for variable in state)
    tokens = tf.random.uniform([args.batch, args.seq_len + 1], maxval=args.vocab, dtype=tf.int32, seed=1)

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=args.directory) as directory:
        run(None, step, state, tokens, 2, args.save_every)  # trace and warm up
        savers = {mode: make_saver(mode, os.path.join(directory, mode)) for mode in MODES}
        # A process's first save also traces lm.checkpoint's read function: once, reported apart.
        first_call = {}
        for mode, saver in savers.items():
            if saver:
                started = time.perf_counter()
                saver.save(0, state, {"bench": True})
                first_call[mode] = time.perf_counter() - started
                saver.wait()
        measured = {mode: [] for mode in MODES}
        for repeat in range(args.repeats):
            for mode in MODES:
                measured[mode].append(run(savers[mode], step, state, tokens, args.steps, args.save_every))

    step_seconds = statistics.median(row["seconds_per_step"] for row in measured["none"])
    interval = args.interval_minutes * 60
    results = {"none": {"seconds_per_step": step_seconds}}
    for mode in MODES[1:]:
        row = {name: statistics.median(run_row[name] for run_row in measured[mode])
               for name in ("stall_per_save_s", "save_call_s", "steps_beside_a_write")}
        row.update(first_save_call_s=first_call[mode], write_cpu_s=statistics.median(savers[mode].write_cpu_s),
                   stall_fraction_of_step=row["stall_per_save_s"] / step_seconds,
                   stall_fraction_per_interval=row["stall_per_save_s"] / interval)
        results[mode] = row
    report = {
        "tensorflow": ".".join(map(str, TF_VERSION)), "cpu_threads": os.cpu_count(),
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "gpus": len(tf.config.list_physical_devices("GPU")),
        "shape": {"layers": args.layers, "d_model": args.d_model, "heads": args.heads, "seq_len": args.seq_len,
                  "batch": args.batch, "vocab": args.vocab, "params": parameter_count(config)},
        "state_bytes": state_bytes, "steps": args.steps, "save_every": args.save_every,
        "interval_minutes": args.interval_minutes, "results": results,
        "target_fraction_of_step": TARGET_FRACTION_OF_STEP,
    }
    print("state %.1f MB, step %.3f s, load average %.1f -> %.1f on %d CPUs"
          % (state_bytes / 1e6, step_seconds, load_before, os.getloadavg()[0], os.cpu_count()))
    print("%-15s %15s %9s %12s %20s %15s %14s" % ("write", "stall/save (s)", "call (s)", "of one step",
                                                "per %g-min interval" % args.interval_minutes, "first call (s)",
                                                "write CPU (s)"))
    for mode in MODES[1:]:
        row = results[mode]
        print("%-15s %15.3f %9.3f %11.1f %% %19.4f %% %15.3f %14.3f" % (
            mode, row["stall_per_save_s"], row["save_call_s"], 100 * row["stall_fraction_of_step"],
            100 * row["stall_fraction_per_interval"], row["first_save_call_s"], row["write_cpu_s"]))
    publish("checkpoint", report)


if __name__ == "__main__":
    main()
