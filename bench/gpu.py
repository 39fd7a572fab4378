"""Training step time and model-FLOPs utilization (MFU) of gpt-1.3b and gpt-350m (or any preset) on one GPU.

    python bench/gpu.py [--presets gpt-1.3b,gpt-350m] [--xla both|on|off] [--seq-len 0]
                        [--batch 0] [--max-batch 256] [--steps 10] [--warmup 2] [--repeats 3]
                        [--precision auto] [--peak-tflops 0] [--json PATH] [--record]

For each preset and each XLA setting, a fresh process (so one configuration's memory never
limits the next) builds the model in the chosen precision (bf16; fp16 with dynamic loss
scaling where the GPU has no bf16: V100, T4) and times the `lm.distributed.single` train step
(forward, backward, clipping, AdamW) at sequence length `--seq-len` (0: the preset's context).

The batch fills memory: unless `--batch` fixes it, it doubles from 1 until a step runs out
of memory (or reaches `--max-batch`), then one bisection step tries the midpoint between the
last batch that fit and the first that did not. Every tried batch is reported; the largest
that fit is timed (`--repeats` x `--steps` steps after `--warmup`, the median repeat).

MFU = tokens/s x flops_per_token / peak: `lm.spec.families.flops_per_token`, 6 x (the blocks' matmul
weights + the output projection) + 12 L T x attention width, the count the planner and the training
log use; the peak being the chip's dense (no structured sparsity) tensor FLOP/s at that precision,
looked up from the GPU's name in PEAK_TFLOPS, or `--peak-tflops`. On a CPU, or an unknown GPU without
`--peak-tflops`, MFU is not computed. Prints a table and JSON; writes bench/results/gpu.json. The
goal is MFU >= 45 % on an H100/H200-class GPU.

`--record` writes the best MFU measured on a GPU of a SageMaker instance type into
controlplane/measured_mfu.json, where it replaces the published figure the planner assumed for that
GPU (`controlplane.planner.assumed_mfu`); commit the file with the measurement.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINING_IMAGE = os.path.join(ROOT, "training_image")
sys.path.insert(0, TRAINING_IMAGE)
sys.path.insert(0, ROOT)  # controlplane.presets: the presets are the control plane's

from publish import publish  # noqa: E402

from controlplane.planner import MEASURED_MFU_FILE  # noqa: E402

# Dense tensor-core peaks in TFLOP/s (half the "with sparsity" figures), from NVIDIA's data sheets:
# H100 and H200 (SXM: 989.4 bf16; PCIe 756; NVL 835), L40S (362), L4 (121), A100 (312, SXM and
# PCIe), A10 (125; AWS's A10G is assumed equal, AWS publishes no tensor figure for it), V100
# (SXM2 125, PCIe 112 fp16; no bf16), T4 (65 fp16; no bf16). First match of a pattern in the
# CUDA device name (e.g. "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB") wins, so the more
# specific patterns come first. Last: the lm.spec.hardware GPU of SageMaker's instance types this
# chip is (the SXM parts; None for chips no instance type has), under which --record files it.
PEAK_TFLOPS = [
    ("H200 NVL", "H200 NVL", {"bf16": 835.0, "fp16": 835.0}, None),
    ("H200", "H200", {"bf16": 989.4, "fp16": 989.4}, "H200"),
    ("H100 PCIe", "H100 PCIe", {"bf16": 756.0, "fp16": 756.0}, None),
    ("H100 NVL", "H100 NVL", {"bf16": 835.0, "fp16": 835.0}, None),
    ("H100", "H100 SXM", {"bf16": 989.4, "fp16": 989.4}, "H100"),
    ("A100", "A100", {"bf16": 312.0, "fp16": 312.0}, "A100"),
    ("L40S", "L40S", {"bf16": 362.0, "fp16": 362.0}, "L40S"),
    ("L4", "L4", {"bf16": 121.0, "fp16": 121.0}, "L4"),
    ("A10G", "A10G", {"bf16": 125.0, "fp16": 125.0}, "A10G"),
    ("A10", "A10", {"bf16": 125.0, "fp16": 125.0}, None),
    ("V100-PCIE", "V100 PCIe", {"fp16": 112.0}, None),
    ("V100", "V100 SXM2", {"fp16": 125.0}, "V100"),
    ("T4", "T4", {"fp16": 65.0}, "T4"),
]
MFU_GOAL = {"H100 SXM": 0.45, "H100 PCIe": 0.45, "H100 NVL": 0.45, "H200": 0.45, "H200 NVL": 0.45}
DEFAULT_PRESETS = "gpt-1.3b,gpt-350m"


class OutOfMemory(Exception):
    """A batch that does not fit on the device."""


def gpu_peak(device_name):
    """(chip, {precision: peak FLOP/s}) for a CUDA device name, or (None, {}) when unknown."""
    for pattern, chip, peaks, _ in PEAK_TFLOPS:
        if pattern.lower() in device_name.lower():
            return chip, {precision: tflops * 1e12 for precision, tflops in peaks.items()}
    return None, {}


def instance_gpu(chip):
    """The lm.spec.hardware GPU name of a chip of PEAK_TFLOPS, or None where no instance type has it."""
    return next((gpu for _, name, _, gpu in PEAK_TFLOPS if name == chip), None)


def record_measurements(results, path, date):
    """Write the best MFU measured per instance GPU among `results` into the measured-MFU file at
    `path` (controlplane.planner.MEASURED_MFU_FILE), keeping the other GPUs' entries; returns the
    GPUs written."""
    best = {}
    for row in results:
        gpu = instance_gpu(row.get("chip"))
        if gpu and row.get("mfu") is not None and (gpu not in best or row["mfu"] > best[gpu]["mfu"]):
            best[gpu] = row
    if not best:
        return []
    with open(path) as handle:
        table = json.load(handle)
    for gpu, row in best.items():
        table[gpu] = {"mfu": round(row["mfu"], 4), "preset": row["preset"], "precision": row["precision"],
                      "xla": row["xla"], "batch": row["batch"], "seq_len": row["seq_len"], "device": row["device"],
                      "tensorflow": row["tensorflow"], "date": date}
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(table, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(temporary, path)
    return sorted(best)


def choose_precision(requested, peaks, on_gpu):
    """bf16 where the chip has it, else fp16 (V100, T4); bf16 on a CPU (the tests' smoke run)."""
    if requested != "auto":
        return requested
    if not on_gpu:
        return "bf16"
    return "bf16" if "bf16" in peaks else "fp16"


def search_batch(fits, max_batch, fixed=0):
    """The largest batch `fits(batch)` accepts: doubling from 1 up to `max_batch`, then one
    bisection step between the last fit and the first failure. `fits` returns True or raises
    OutOfMemory. Returns (best batch or 0, [(batch, fitted)] in the order tried)."""
    tried = []

    def attempt(batch):
        try:
            fits(batch)
            tried.append((batch, True))
            return True
        except OutOfMemory:
            tried.append((batch, False))
            return False

    if fixed:
        return (fixed if attempt(fixed) else 0), tried
    best, batch = 0, 1
    while batch <= max_batch and attempt(batch):
        best, batch = batch, batch * 2
    if best and batch <= max_batch:
        middle = (best + batch) // 2
        if best < middle < batch and attempt(middle):
            best = middle
    return best, tried


# ---- one configuration, in its own process ----

def measure(preset, xla, args):
    """JSON-ready results of one (preset, xla) configuration, timed in this process."""
    from lm.compat import TF_VERSION, keras, tf
    from controlplane.presets import get_preset
    from lm import models
    from lm.spec.families import flops_per_token, parameter_count
    from lm.distributed import get_strategy
    from lm.training.optim import AdamW, DynamicLossScale, learning_rate_at
    from lm.training.train import token_loss
    from train_step import time_train_step

    gpus = tf.config.list_physical_devices("GPU")
    device_name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else "CPU"
    chip, peaks = gpu_peak(device_name) if gpus else (None, {})
    precision = choose_precision(args.precision, peaks, bool(gpus))
    peak = args.peak_tflops * 1e12 if args.peak_tflops else peaks.get(precision)
    keras.mixed_precision.set_global_policy(
        {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[precision])
    config = get_preset(preset)
    seq_len = args.seq_len or config.block_size
    strategy = get_strategy("single").setup()
    tf.random.set_seed(0)
    model = models.build(config)
    optimizer = AdamW(model.trainable_variables, lambda step: learning_rate_at(step, 1e-4, 10, 1000, 0.1))
    loss_scale = DynamicLossScale() if precision == "fp16" else None
    step = strategy.build_train_step(model, optimizer, token_loss(tf), grad_clip=1.0, loss_scale=loss_scale,
                                     jit_compile=xla)

    def run(batch, steps):
        tokens = tf.random.uniform([batch, seq_len + 1], maxval=config.vocab_size, dtype=tf.int32, seed=1)
        return time_train_step(step, tokens, steps)

    def fits(batch):
        try:
            run(batch, args.warmup)
        except tf.errors.ResourceExhaustedError:
            raise OutOfMemory(batch)
        return True

    best, tried = search_batch(fits, args.max_batch, args.batch)
    result = {"preset": preset, "xla": xla, "precision": precision, "device": device_name, "chip": chip,
              "peak_flops": peak, "seq_len": seq_len, "params": parameter_count(config),
              "tensorflow": ".".join(map(str, TF_VERSION)), "batches_tried": tried}
    # A batch that fitted once can fail after an out-of-memory attempt fragmented the allocator:
    # then the next smaller one that fitted is timed.
    seconds = None
    for batch in sorted((batch for batch, fitted in tried if fitted and batch <= best), reverse=True):
        if gpus and hasattr(tf.config.experimental, "reset_memory_stats"):
            tf.config.experimental.reset_memory_stats("GPU:0")
        try:
            seconds = [run(batch, args.steps) for _ in range(args.repeats)]
        except tf.errors.ResourceExhaustedError:
            continue
        best = batch
        break
    result["batch"] = best if seconds else 0
    if not seconds:
        result["error"] = "batch %d does not fit in device memory" % (args.batch or 1)
        return result
    per_step = statistics.median(seconds)
    tokens_per_s = best * seq_len / per_step
    model_flops = tokens_per_s * flops_per_token(config, seq_len)
    result.update(seconds_per_step=per_step, seconds_per_step_repeats=seconds, tokens_per_s=tokens_per_s,
                  model_flops_per_s=model_flops, mfu=model_flops / peak if peak else None)
    if gpus:
        result["peak_memory_bytes"] = tf.config.experimental.get_memory_info("GPU:0")["peak"]
    return result


# ---- the driver ----

def child_command(preset, xla, args):
    command = [sys.executable, os.path.abspath(__file__), "--child", preset, "--xla", "on" if xla else "off"]
    for name in ("seq_len", "batch", "max_batch", "steps", "warmup", "repeats", "precision", "peak_tflops"):
        command += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return command


def run_configuration(preset, xla, args):
    """The child's JSON result; a crash (the process killed by an out-of-memory abort, say) is
    reported as an error with the end of its output, never as a number."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [TRAINING_IMAGE, os.environ.get("PYTHONPATH")])))
    result = subprocess.run(child_command(preset, xla, args), env=env, capture_output=True, text=True)
    for line in reversed(result.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"preset": preset, "xla": xla, "error": "exit status %d: %s" % (
        result.returncode, "\n".join((result.stdout + result.stderr).strip().splitlines()[-5:]))}


def table(results):
    rows = ["%-9s %-4s %-5s %6s %10s %12s %8s  %s" % ("preset", "xla", "prec", "batch", "s/step", "tokens/s", "MFU",
                                                     "batches tried (x: out of memory)")]
    for row in results:
        tried = " ".join("%d%s" % (batch, "" if fitted else "x") for batch, fitted in row.get("batches_tried", []))
        if "seconds_per_step" not in row:
            rows.append("%-9s %-4s %-5s %s" % (row["preset"], "on" if row["xla"] else "off", row.get("precision", "-"),
                                             "error: " + row.get("error", "?")))
            continue
        mfu = "%.1f %%" % (100 * row["mfu"]) if row["mfu"] is not None else "-"
        rows.append("%-9s %-4s %-5s %6d %10.4f %12.0f %8s  %s" % (
            row["preset"], "on" if row["xla"] else "off", row["precision"], row["batch"], row["seconds_per_step"],
            row["tokens_per_s"], mfu, tried))
    return "\n".join(rows)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=DEFAULT_PRESETS, help="comma-separated presets (any family)")
    parser.add_argument("--xla", choices=("both", "on", "off"), default="both")
    parser.add_argument("--seq-len", type=int, default=0, help="0: the preset's context length")
    parser.add_argument("--batch", type=int, default=0, help="a fixed batch; 0: fill memory")
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", choices=("auto", "bf16", "fp16", "fp32"), default="auto")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="override the chip's peak (0: from the table)")
    parser.add_argument("--json", metavar="PATH", help="write the JSON report here, not to bench/results/gpu.json")
    parser.add_argument("--record", nargs="?", const=MEASURED_MFU_FILE, metavar="PATH",
                        help="write the best MFU per GPU into the planner's measured-MFU file (default %(const)s)")
    parser.add_argument("--child", metavar="PRESET", help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.xla == "on", args)), flush=True)
        return 0
    settings = {"both": (False, True), "on": (True,), "off": (False,)}[args.xla]
    results = [run_configuration(preset, xla, args) for preset in args.presets.split(",") for xla in settings]
    measured = [row for row in results if row.get("mfu") is not None]
    best = max(measured, key=lambda row: row["mfu"]) if measured else None
    goal = MFU_GOAL.get(best["chip"]) if best else None
    report = {"results": results, "best": best and {name: best[name] for name in ("preset", "xla", "batch", "mfu")},
              "mfu_goal": goal, "goal_met": (best["mfu"] >= goal) if goal else None}
    print(table(results))
    if best:
        print("best MFU: %.1f %% (%s, xla %s, batch %d)%s" % (
            100 * best["mfu"], best["preset"], best["xla"], best["batch"],
            "; goal %.0f %%: %s" % (100 * goal, "met" if report["goal_met"] else "not met") if goal else ""))
    if args.json:
        print(json.dumps(report, indent=2))
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    else:
        publish("gpu", report)
    if args.record:
        recorded = record_measurements(results, args.record, datetime.date.today().isoformat())
        print("recorded in %s: %s" % (args.record, ", ".join(recorded) if recorded else
                                       "nothing (no MFU measured on a GPU of a SageMaker instance type)"))
    return 1 if any("error" in row for row in results) else 0


if __name__ == "__main__":
    sys.exit(main())
