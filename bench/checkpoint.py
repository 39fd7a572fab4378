"""What a checkpoint save costs training, in time and memory: lm.checkpoint's host snapshot and
paced writer against the device snapshot it replaced and against the unpaced writer.

    python bench/checkpoint.py [--layers 4] [--d-model 512] [--heads 8] [--seq-len 128] [--batch 4]
                               [--vocab 8192] [--saves 5] [--alone 3] [--noise-steps 12]
                               [--interval-minutes 15] [--directory DIR]

In one process the `lm.distributed.single` train step (AdamW, clipping) runs episodes of each
mode in turn, `--saves` rounds, the order rotated every round (a busy machine slows all alike):

- `none`: no checkpoint. Its "stall" is the estimator below applied to `--noise-steps` steps
  without any write: the noise floor of this machine;
- `sync`: `lm.checkpoint.Checkpointer(background=False)`: the write on the training thread;
- `device`: the reference for where the snapshot lives, the snapshot lm.checkpoint took before
  (`DeviceSnapshot`): the reads of the variables, held on the device until the writer thread has
  copied them to host memory, so the next update copies every buffer it writes; paced writer;
- `unpaced`: the reference for the pacing, lm.checkpoint's background writer at full speed
  (`writer_share=1`, lowest priority);
- `paced`: lm.checkpoint's default: the snapshot copied into host memory on the training
  thread (`host_snapshot`), and a writer that sleeps so that it takes at most 2 % of one core while
  no core is idle.

An episode: `--alone` steps without a write, one save (its call timed), then steps until the
write is on disk. The stall of a save is its call plus, for each step that ran while the write
was in flight, its time beyond the median of the round's steps without a write (what the writer
takes from training: CPU cores, memory bandwidth). Reported per save (seconds, and as a share of
one step), per step while a write runs (the share of each step the write takes), and over one
`--interval-minutes` time-based checkpoint interval (lm.training.train's `checkpoint_minutes`). Also the
CPU time of the writer thread per save and the training's own extra CPU time per save (copies on
write, cache misses), measured with thread CPU clocks, which the machine's other load disturbs
less than wall times. The spread of the steps without a write (10th to 90th percentile) and the
standard error of the per-step figure say whether 2 % is within this machine's noise.

The call's CPU time on the training thread (`save_call_cpu_s`: for the host snapshot, its copy) is
the figure the machine's other load disturbs least.

Memory, per save: `device_extra_bytes`, how far TensorFlow's allocator peak of the steps beside the
write rises above the median peak of the round's steps without a write (the device's own statistics:
the GPU's, or the CPU's BFC allocator, which this script selects with TF_CPU_ALLOCATOR_USE_BFC before
TensorFlow starts), and `snapshot_host_bytes`, the NumPy arrays the snapshot holds in host memory.
Prints a table and JSON; writes bench/results/checkpoint.json.
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training_image"))
# The allocator that keeps statistics on the CPU too (tf.config.experimental.get_memory_info raises
# with the default one); read when TensorFlow starts, so before it is imported.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

from publish import publish  # noqa: E402

from lm import checkpoint  # noqa: E402
from lm.compat import TF_VERSION, tf  # noqa: E402
from lm.spec.families import GPTConfig, parameter_count  # noqa: E402
from lm.distributed import get_strategy  # noqa: E402
from lm.models.gpt import build_model  # noqa: E402
from lm.training.optim import AdamW, learning_rate_at  # noqa: E402
from lm.training.train import token_loss  # noqa: E402

TARGET_FRACTION_OF_STEP = 0.02
MODES = ("none", "sync", "device", "unpaced", "paced")
DEVICE = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"


class DeviceSnapshot(checkpoint.Checkpointer):
    """The snapshot lm.checkpoint took before it moved to host memory: the reads of the variables
    (tensors sharing the variables' device buffers), held until the writer thread has copied them to host
    memory; an update meanwhile copies each buffer a held read shares (copy on write)."""

    def take_snapshot(self, variables):
        return [variable.read_value() for variable in variables]

    def _write(self, step, values, meta, chunk_done):
        arrays = [np.asarray(value) for value in values]  # to host memory first, as it did
        del values[:]
        return super()._write(step, arrays, meta, chunk_done)


class Saver:
    """A Checkpointer, the CPU clock of its writer thread (0 for a synchronous one) and the host bytes of
    its last snapshot (NumPy arrays; a device snapshot's tensors count 0)."""

    def __init__(self, mode, directory):
        background = mode != "sync"
        kind = DeviceSnapshot if mode == "device" else checkpoint.Checkpointer
        self.files = kind(directory, background=background,
                          writer_share=1.0 if mode == "unpaced" else checkpoint.WRITER_SHARE)
        self.snapshot_host_bytes = 0
        take_snapshot = self.files.take_snapshot

        def counted(variables):
            values = take_snapshot(variables)
            self.snapshot_host_bytes = sum(value.nbytes for value in values if isinstance(value, np.ndarray))
            return values

        self.files.take_snapshot = counted
        self._clock = None
        if background:
            writer_thread = self.files._writer.submit(threading.get_ident).result()
            self._clock = time.pthread_getcpuclockid(writer_thread)

    def writer_cpu(self):
        return time.clock_gettime(self._clock) if self._clock is not None else 0.0


def timed_step(step, inputs, labels, saver):
    """(wall seconds, training CPU seconds, writer CPU seconds, the device allocator's peak bytes) of one step."""
    tf.config.experimental.reset_memory_stats(DEVICE)
    writer_before, cpu_before, started = saver.writer_cpu() if saver else 0.0, time.process_time(), time.perf_counter()
    float(step(inputs, labels)["loss"])
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_before
    writer = (saver.writer_cpu() - writer_before) if saver else 0.0
    return wall, cpu - writer, writer, tf.config.experimental.get_memory_info(DEVICE)["peak"]


def episode(mode, saver, step, state, inputs, labels, alone_steps, noise_steps, index):
    """Steps without a write, then one save and the steps that run until it is on disk."""
    alone = [timed_step(step, inputs, labels, saver) for _ in range(alone_steps)]
    if saver is None:
        return {"alone": alone, "call": 0.0, "beside": [timed_step(step, inputs, labels, None)
                                                       for _ in range(noise_steps)], "write_wall": 0.0}
    writer_before, call_cpu, started = saver.writer_cpu(), time.thread_time(), time.perf_counter()
    saver.files.save(index, state, {"bench": True})
    call, call_cpu = time.perf_counter() - started, time.thread_time() - call_cpu
    beside = []
    while saver.files.writing():
        beside.append(timed_step(step, inputs, labels, saver))
    write_wall = time.perf_counter() - started
    saver.files.wait()
    return {"alone": alone, "call": call, "call_cpu": call_cpu, "beside": beside, "write_wall": write_wall,
            "writer_cpu": saver.writer_cpu() - writer_before + (call_cpu if mode == "sync" else 0.0),
            "snapshot_host_bytes": saver.snapshot_host_bytes}


def summarize(mode, episodes, baselines):
    """Per save and per step figures of one mode; `baselines[i]`: (wall, training CPU, device peak) medians of
    round i."""
    stalls, per_step, training_cpu, beside_count, device_extra = [], [], [], [], []
    for (wall_base, cpu_base, peak_base), row in zip(baselines, episodes):
        excess = [wall - wall_base for wall, _, _, _ in row["beside"]]
        stalls.append(row["call"] + sum(excess))
        per_step.extend(value / wall_base for value in excess)
        training_cpu.append(sum(cpu - cpu_base for _, cpu, _, _ in row["beside"]))
        beside_count.append(len(row["beside"]))
        device_extra.append(max([peak for _, _, _, peak in row["beside"]] or [peak_base]) - peak_base)
    result = {"stall_per_save_s": statistics.median(stalls), "stall_per_save_all_s": stalls,
              "save_call_s": statistics.median(row["call"] for row in episodes),
              "save_call_cpu_s": statistics.median(row.get("call_cpu", 0.0) for row in episodes),
              "steps_beside_a_write": statistics.median(beside_count),
              "training_extra_cpu_per_save_s": statistics.median(training_cpu),
              "device_extra_bytes": statistics.median(device_extra), "device_extra_bytes_all": device_extra}
    if per_step:
        result["stall_fraction_per_step_while_writing"] = statistics.mean(per_step)
        result["per_step_standard_error"] = (statistics.stdev(per_step) / len(per_step) ** 0.5
                                            if len(per_step) > 1 else None)
    if mode != "none":
        result["write_wall_s"] = statistics.median(row["write_wall"] for row in episodes)
        result["writer_cpu_per_save_s"] = statistics.median(row["writer_cpu"] for row in episodes)
        result["snapshot_host_bytes"] = statistics.median(row["snapshot_host_bytes"] for row in episodes)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--saves", type=int, default=5, help="rounds; each mode saves once per round")
    parser.add_argument("--alone", type=int, default=3, help="steps without a write before each save")
    parser.add_argument("--noise-steps", type=int, default=12, help="steps of the `none` mode's estimate")
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
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=args.directory) as directory:
        for _ in range(2):  # trace and warm up
            timed_step(step, inputs, labels, None)
        savers = {mode: Saver(mode, os.path.join(directory, mode)) if mode != "none" else None for mode in MODES}
        first_call = {}
        for mode, saver in savers.items():  # a first save of each: its first-touch page faults are not a save's cost
            if saver:
                started = time.perf_counter()
                saver.files.save(0, state, {"bench": True})
                first_call[mode] = time.perf_counter() - started
                saver.files.wait()
        episodes = {mode: [] for mode in MODES}
        baselines = []
        for round_index in range(args.saves):
            order = MODES[round_index % len(MODES):] + MODES[:round_index % len(MODES)]
            rows = {mode: episode(mode, savers[mode], step, state, inputs, labels, args.alone, args.noise_steps,
                                  round_index + 1) for mode in order}
            alone = [sample for row in rows.values() for sample in row["alone"]]
            baselines.append((statistics.median(wall for wall, _, _, _ in alone),
                              statistics.median(cpu for _, cpu, _, _ in alone),
                              statistics.median(peak for _, _, _, peak in alone)))
            for mode in MODES:
                episodes[mode].append(rows[mode])

    alone_walls = [wall for mode in MODES for row in episodes[mode] for wall, _, _, _ in row["alone"]]
    step_seconds = statistics.median(alone_walls)
    interval = args.interval_minutes * 60
    results = {}
    for mode in MODES:
        row = summarize(mode, episodes[mode], baselines)
        row.update(stall_fraction_of_step=row["stall_per_save_s"] / step_seconds,
                   stall_fraction_per_interval=row["stall_per_save_s"] / interval)
        if mode in first_call:
            row["first_save_call_s"] = first_call[mode]
        results[mode] = row
    spread = [float(np.percentile(alone_walls, 10)), float(np.percentile(alone_walls, 90))]
    report = {
        "tensorflow": ".".join(map(str, TF_VERSION)), "cpu_threads": os.cpu_count(),
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "gpus": len(tf.config.list_physical_devices("GPU")), "device": DEVICE,
        "shape": {"layers": args.layers, "d_model": args.d_model, "heads": args.heads, "seq_len": args.seq_len,
                  "batch": args.batch, "vocab": args.vocab, "params": parameter_count(config)},
        "state_bytes": state_bytes, "params": parameter_count(config), "saves": args.saves,
        "interval_minutes": args.interval_minutes,
        "writer_share": checkpoint.WRITER_SHARE,
        "step_without_a_write": {"median_s": step_seconds, "p10_p90_s": spread, "samples": len(alone_walls),
                                 "round_medians_s": [wall for wall, _, _ in baselines]},
        "results": results, "target_fraction_of_step": TARGET_FRACTION_OF_STEP,
    }
    publish("checkpoint", report)
    print("state %.1f MB; step without a write %.3f s (p10-p90 %.3f-%.3f, %d steps); load average %.1f -> %.1f "
          "on %d CPUs" % (state_bytes / 1e6, step_seconds, spread[0], spread[1], len(alone_walls), load_before,
                          os.getloadavg()[0], os.cpu_count()))
    print("%-8s %10s %9s %16s %8s %10s %9s %9s %11s %9s %12s %14s %14s" % (
        "write", "stall/save", "of a step", "per step writing", "steps", "write wall", "call", "call CPU",
        "device MB+", "host MB", "writer CPU", "training CPU+", "per %g min" % args.interval_minutes))
    for mode in MODES:
        row = results[mode]
        per_step = row.get("stall_fraction_per_step_while_writing")
        error = row.get("per_step_standard_error")
        print("%-8s %9.3fs %8.1f%% %16s %8g %9.2fs %8.3fs %8.3fs %11.1f %9.1f %11.3fs %13.3fs %13.4f%%" % (
            mode, row["stall_per_save_s"], 100 * row["stall_fraction_of_step"],
            "-" if per_step is None else "%.1f%% +- %.1f%%" % (100 * per_step, 100 * (error or 0.0)),
            row["steps_beside_a_write"], row.get("write_wall_s", 0.0), row["save_call_s"], row["save_call_cpu_s"],
            row["device_extra_bytes"] / 1e6, row.get("snapshot_host_bytes", 0) / 1e6,
            row.get("writer_cpu_per_save_s", 0.0), row["training_extra_cpu_per_save_s"],
            100 * row["stall_fraction_per_interval"]))


if __name__ == "__main__":
    main()
