"""Memory, strategy, time and cost of a training run, before a dollar is spent.

    python -m lmstack.plan --preset gpt-1.3b --instance-type ml.p4d.24xlarge --instance-count 2

Pure Python, no TensorFlow: the gate (`controlplane.gate`, the state machine's Lambda function and
`lmstack.start`) plans every execution input with `plan()`; `feasibility_table()` tabulates the
smallest run of every preset, GPU type and strategy. Strategy constraints come from `lm.spec.job`, hardware,
FLOP/s and MFU from `lm.spec.hardware`, prices from `controlplane.prices`.

Memory per GPU (bytes), P = parameters held by that GPU, c = bytes per activation element
(4 fp32, 2 fp16/bf16), u = micro_batch * seq_len * d_model, z = micro_batch * seq_len * padded_vocab:
- weights 4P (variables stay float32 under mixed precision), gradients 4P (float32),
  optimizer 8P (AdamW m and v, float32), plus 2P under mixed precision for the float16
  copies the model casts every kernel to and keeps for the backward pass (`lm.models.gpt`).
- activations one block keeps for its backward pass: the family's `block_activation_bytes`
  (`lm.spec.families`: GPT's is Korthikanti et al. 2022 adapted to TF and measured, tests/plan;
  RNN's an estimate from one CPU measurement). Every model config gives the planner the same
  few sizes (the interface of `lm.spec.families.base.ModelConfig`), so every preset of every
  family plans. Recomputation (`tf.recompute_grad` per block) keeps each block's input (u c) and rebuilds
  one block at a time in the backward pass.
- the loss: float32 logits and the cross-entropy gradient (8z), alive together at the end
  of the forward pass, plus the final LayerNorm (2 u c). The output layer's gradients are
  made before the blocks are rebuilt, so the logits gradient is gone by then.
- SMP with several microbatches: the step sums the microbatches' gradients into one
  accumulator (4P, alive from the first microbatch to the update), and each microbatch's own
  gradients (4P) are made while the other microbatches in flight keep their activations.
- a checkpoint save takes nothing on the GPU: lm.checkpoint copies the weights, m and v
  into host memory between two steps (see "Host memory" below).
- the update: the gradients and their clipped copies (8P; tf.clip_by_global_norm makes every
  clipped gradient before the first is applied); under accumulation the clipped copies next to
  the accumulator (4P).
- peak = weights + optimizer (+ accumulator) + the transient peak, the larger of the update and:
  * without recomputation: float16 copies + kept activations + loss; the backward pass frees
    activations as it creates gradients, so the two never add up;
  * with recomputation: float16 copies + the larger of the loss (with every block's input
    kept) and the rebuild of a block: the rebuilt block's activations, the gradients its
    backward pass makes from them (REBUILD_BACKWARD_SHARE of the block's activations more,
    measured), the gradient arriving from the block above (u c), and what the blocks around
    it leave: rebuilding the last block, every block's input and the gradients of the
    embeddings and that block; rebuilding the first, its own input and every weight
    gradient (4P), whichever is more.
- headroom: RESERVED_GIB per GPU for the CUDA context and cuBLAS/cuDNN workspaces, and a
  FRAGMENTATION share of the rest for the allocator.
Checked against TensorFlow's allocator peak on the CPU in tests/plan/test_measured.py
(float32; the mixed-precision terms cannot be measured without a GPU).

Host memory (the chief's host): the checkpoint snapshot, CHECKPOINT_SNAPSHOT_BYTES (12) a parameter,
for the strategies whose saves take one (SNAPSHOT_STRATEGIES; SMP saves through its own library,
synchronously), against the host's memory less FRAGMENTATION and HOST_RESERVED_GIB for each
training process. On an instance without GPUs the snapshot shares the one memory with training.

Time: tokens/s = GPUs x peak FLOP/s x MFU / flops_per_token (`lm.spec.families`: 6 x (the
blocks' matmul weights + the output projection) + 12 x layers x seq_len x attention width, the
count the training log's MFU uses too), times the pipeline efficiency m / (m + p - 1) under SMP; the gradient
all-reduce between hosts (ring, 2 (H-1)/H of the float32 gradients through each host's
network at NETWORK_EFFICIENCY) follows the backward pass, so a step takes the sum of the two,
except where the strategy's code path lets it overlap the backward pass (SMDDP without XLA;
`allreduce_overlaps_backward`), where a step takes the longer of the two.

Learning rate: the peak rate the run uses (`lm.spec.families.peak_learning_rate`: GPT-3's for the
size, Table 2.1, whatever the batch, as Pythia kept it; with scale_lr, Adam's square-root rule
downwards from GPT-3's batch for the size).
"""
import collections
import json
import math
import os
import re

from controlplane import throughput
from controlplane import base_images
from controlplane import prices, pricing
from lm.spec import hardware
from lm.spec import interruptions, job
from lm.spec.conditions import INSTANCE_COUNT_FIELD, INSTANCE_TYPE_FIELD, STRATEGY_FIELD, broken
from controlplane.presets import ALL_PRESETS, get_preset
from lm.spec.families import FAMILIES, ModelConfig, flops_per_token, parameter_count, peak_learning_rate
from lm.spec.families.base import gpt3_training
from lm.spec.families.gpt import MEASURED_U_ELEMENTS  # noqa: F401 (GPT's measured figure, checked in tests/plan)

GIB = 2 ** 30
RESERVED_GIB = 1.0
FRAGMENTATION = 0.10
NETWORK_EFFICIENCY = 0.7
# EnableInterContainerTrafficEncryption (IPsec between the hosts of a job) "can increase training time,
# especially if you are using distributed deep learning algorithms", depending on "the amount of
# communication between compute instances"; one host is not affected (SageMaker Developer Guide,
# "Protect Communications Between ML Compute Instances in a Distributed Training Job", train-encrypt).
# The page gives no figure: this is our assumption, the all-reduce between hosts taking twice as long
# when on, until a real multi-host job measures it.
ENCRYPTED_ALLREDUCE_SLOWDOWN = 2.0
TOKENS_PER_PARAMETER = 20  # Chinchilla (Hoffmann et al. 2022)
TABLE_SEQ_LEN = 2048
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
COMPUTE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
SMP_PIPELINES = job.SMP_CHOICES["pipeline"]
# A checkpoint save (lm.checkpoint.Checkpointer) copies the weights and AdamW's m and v
# (float32: 4 + 4 + 4 bytes a parameter) into NumPy arrays in the chief's host memory and keeps them
# until its writer thread has written the file; the GPU holds no copy (tests/plan/test_measured.py
# measures both). It used to hold the reads on the device instead: 11.3 to 13.9 bytes a parameter
# more on the GPU, which refused data parallelism for gpt-760m and gpt-1.3b on a 40 GB A100.
CHECKPOINT_SNAPSHOT_BYTES = 12
# The strategies whose checkpoints take that snapshot (lm.distributed.base.Checkpoints, written by
# the chief); SMP saves through smp.CheckpointManager between steps, synchronously
# (lm.distributed.smp.SMPCheckpoints). tests/training/test_plan_runtime.py checks this list
# against each strategy's checkpoints.
SNAPSHOT_STRATEGIES = ("single", "mwms", "horovod", "smddp")
# Host memory each training process takes for itself (Python, TensorFlow, the CUDA context's host
# side, the input pipeline): an assumption, not measured on a GPU host; the snapshot must fit beside.
HOST_RESERVED_GIB = 4.0
# While a rebuilt block's backward pass runs, the gradients it makes from the block's activations
# add this share of the block's activations (`block_activation_bytes`) before they are freed:
# measured on the CPU allocator, 0.27 to 0.46 for GPT's block and 0.55 to 0.8 for Llama's
# (tests/plan/test_measured.py).
REBUILD_BACKWARD_SHARE = 0.5
SHORTEST_SEQ_LEN = 128  # the shortest sequence length a rejection suggests
DEFAULT_GLOBAL_BATCH = job.HYPERPARAMETERS["global_batch_size"].default
XLA_DEFAULT = job.HYPERPARAMETERS["xla"].default
SCALE_LR_DEFAULT = job.HYPERPARAMETERS["scale_lr"].default
DATA_PARALLEL = ("mwms", "horovod", "smddp")
# lmstack's own MFU per GPU, measured by `bench/gpu.py --record` (the best configuration it timed on
# that GPU): {gpu: {"mfu": fraction, "preset", "precision", "xla", "batch", "seq_len", "device",
# "tensorflow", "date"}}. Where a GPU has an entry it replaces the published figure
# (controlplane.throughput.PUBLISHED_MFU); none is committed yet (no GPU was lent to the project's sessions).
MEASURED_MFU_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "measured_mfu.json")


def load_measured_mfu(path=MEASURED_MFU_FILE):
    with open(path) as handle:
        return json.load(handle)


MEASURED_MFU = load_measured_mfu()


def _field_error(field, allowed, value):
    return ValueError("%s must be one of %s, got %r" % (field, ", ".join(str(a) for a in allowed), value))


def resolve_config(preset_or_config):
    return preset_or_config if isinstance(preset_or_config, ModelConfig) else get_preset(preset_or_config)


def runtime_cuda(runtime):
    """CUDA version (major, minor) of a runtime (`controlplane.base_images.RUNTIMES`), read from its DLC tag ("-cu112-")."""
    found = re.search(r"-cu(\d+)(\d)-", base_images.RUNTIMES[runtime])
    return int(found.group(1)), int(found.group(2))


def resolve_precision(precision, instance):
    if precision not in PRECISIONS:
        raise _field_error("precision", PRECISIONS, precision)
    if not instance.gpus:
        if precision not in ("auto", "fp32"):
            raise ValueError("precision %r needs a GPU; %s has none (use fp32 or auto)" % (precision, instance.name))
        return "fp32"
    gpu = hardware.get_gpu(instance.gpu)
    if precision == "auto":
        return hardware.auto_precision(instance.gpu)
    if precision not in gpu.peak_flops:
        raise ValueError("precision %r is not supported on %s (%s); allowed there: %s" % (
            precision, instance.name, gpu.name, ", ".join(sorted(gpu.peak_flops))))
    return precision


def cannot_run(strategy, instance_type, instance_count=1, recompute=False, model=None):
    """Why `strategy` cannot run on this instance type and count (or with `recompute`, or for the
    model family `model`: the input rules of lm.spec.job, the family's capabilities among them,
    then the hardware), or None when it can."""
    if strategy not in job.STRATEGIES:
        raise _field_error("strategy", job.STRATEGIES, strategy)
    instance = hardware.get_instance(instance_type)
    refused = broken(job.job_rules(), {STRATEGY_FIELD: strategy,
                                       INSTANCE_TYPE_FIELD: instance_type,
                                       INSTANCE_COUNT_FIELD: instance_count,
                                       "hyperparameters": dict({"recompute": recompute},
                                                               **({"model": model} if model else {}))})
    if refused:
        return refused
    if strategy == "smp" and instance.gpus < 2:
        return "smp splits the model over the GPUs of a host; %s has %d" % (instance_type, instance.gpus)
    if instance.gpus:
        runtime = base_images.STRATEGY_RUNTIME[strategy]
        have, need = runtime_cuda(runtime), hardware.get_gpu(instance.gpu).min_cuda
        if have < need:
            return "%s needs the %s image (CUDA %d.%d); %s GPUs (%s) need CUDA %d.%d or newer" % (
                strategy, base_images.RUNTIMES[runtime], have[0], have[1], instance_type, instance.gpu, need[0], need[1])
    return None


# ---- memory ----

def layer_activation_bytes(config, micro_batch, seq_len, compute_bytes, xla=False):
    """Bytes one block keeps for its backward pass: the family's own count (see the module docstring)."""
    return config.block_activation_bytes(micro_batch, seq_len, compute_bytes, xla)


def memory(config, micro_batch, seq_len, precision, *, recompute=False, xla=False, partitions=1, in_flight=1,
           accumulate=False):
    """Peak bytes on one GPU (the busiest pipeline stage under SMP), by component.

    Under SMP v1 a GPU holds only its partition: "any operation that is part of
    smp.DistributedModel.call() ... executes in exactly one of the devices" (SageMaker SDK,
    smp_versions "TensorFlow API"), and the model is partitioned in the first smp.step call,
    before any weight exists (lm.distributed.smp builds the GPT without weights, runs one
    partitioning step, then creates AdamW's slots for this rank's variables only). With
    manual placement (`auto_partition: false`) lm.distributed.smp puts block i in partition
    i * partitions // n_layer and the embeddings, the tied output layer and the loss in
    partition 0, so partition 0 is the busiest: the embeddings, ceil(n_layer / partitions)
    blocks and the loss (the logits never leave it). Its weights, gradients, AdamW state
    and float16 copies are those P parameters; activations are kept for `in_flight`
    microbatches. With auto-partitioning the library balances the stages itself; this
    bound stays an upper one. The export gathers the whole model into host memory of the
    chief (4 bytes per parameter, not on a GPU).

    `accumulate` (SMP with several microbatches): the step sums the microbatches' gradients
    into one accumulator (4P, alive from the first microbatch to the update); a microbatch's
    own gradients (4P) are made while the other microbatches in flight keep their
    activations. A checkpoint's snapshot is in host memory, not here (`host_memory`)."""
    c = COMPUTE_BYTES[precision]
    layers = -(-config.n_layer // partitions)
    block = config.block_parameter_count()
    embedding = parameter_count(config) - config.n_layer * block
    params = embedding + layers * block if partitions > 1 else parameter_count(config)
    u = micro_batch * seq_len * config.d_model
    z = micro_batch * seq_len * config.padded_vocab_size
    per_layer = layer_activation_bytes(config, micro_batch, seq_len, c, xla)
    full = in_flight * layers * per_layer
    kept_inputs = in_flight * layers * u * c
    # A rebuilt block's activations and the gradients its backward pass makes from them.
    rebuilt = int(per_layer * (1 + REBUILD_BACKWARD_SHARE))
    loss = 8 * z + 2 * u * c
    parts = collections.OrderedDict([
        ("params", params),
        ("weights", 4 * params),
        ("gradients", 4 * params),
        ("clipped_gradients", 4 * params),
        ("gradient_accumulator", 4 * params if accumulate else 0),
        ("optimizer", 8 * params),
        ("compute_copies", 2 * params if c != 4 else 0),
        ("activations", full),
        ("activations_recompute", kept_inputs + rebuilt),
        ("loss", loss),
    ])
    # The update: the gradients to apply (the accumulator's under `accumulate`, counted above) and
    # their clipped copies, which tf.clip_by_global_norm makes for every gradient before AdamW applies one.
    update = parts["clipped_gradients"] + (0 if accumulate else parts["gradients"])
    if recompute:
        # Rebuilding the last block: every block's input is kept, the embeddings' and that block's
        # gradients are made; rebuilding the first: its input is kept, every gradient is made.
        around_last = kept_inputs + 4 * (embedding + block)
        around_first = in_flight * u * c + parts["gradients"]
        rebuild = rebuilt + u * c + max(around_last, around_first)
        transient = max(parts["compute_copies"] + max(kept_inputs + loss, rebuild), update)
    elif accumulate:
        others_in_flight = full * (in_flight - 1) // in_flight
        transient = max(parts["compute_copies"] + max(full + loss, others_in_flight + parts["gradients"]), update)
    else:
        transient = max(parts["compute_copies"] + full + loss, update)
    parts["peak"] = parts["weights"] + parts["optimizer"] + parts["gradient_accumulator"] + transient
    return parts


def host_memory(config, instance, strategy, device_peak):
    """The chief's host memory beyond what its training processes take for themselves: the checkpoint
    snapshot (CHECKPOINT_SNAPSHOT_BYTES a parameter, for SNAPSHOT_STRATEGIES) and what the host has
    for it (`usable_host_bytes`; without GPUs, less the training's own peak `device_peak`, which is in
    the same memory)."""
    snapshot = CHECKPOINT_SNAPSHOT_BYTES * parameter_count(config) if strategy in SNAPSHOT_STRATEGIES else 0
    usable = usable_host_bytes(instance) - (0 if instance.gpus else device_peak)
    return collections.OrderedDict([("checkpoint_snapshot", snapshot), ("usable", usable)])


def step_flops(config, batch, seq_len, recompute=False):
    """Matmul FLOPs one training step executes on `batch` sequences: `flops_per_token` for each of
    its tokens (forward and backward of the blocks and the output layer), plus one more forward of
    the blocks (`block_forward_flops`) under recomputation."""
    recomputed = config.n_layer * config.block_forward_flops(batch, seq_len) if recompute else 0
    return batch * seq_len * flops_per_token(config, seq_len) + recomputed


def usable_bytes(instance):
    if not instance.gpus:
        return instance.memory_gib * GIB * (1 - FRAGMENTATION)
    return (instance.gpu_memory_gib - RESERVED_GIB) * GIB * (1 - FRAGMENTATION)


def usable_host_bytes(instance):
    """Host memory a checkpoint snapshot may take: the host's, less FRAGMENTATION and HOST_RESERVED_GIB for
    each training process (one per GPU; without GPUs the process's memory is the training peak)."""
    return instance.memory_gib * GIB * (1 - FRAGMENTATION) - HOST_RESERVED_GIB * GIB * instance.gpus


# ---- one strategy on one instance type ----

def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _layout(strategy, instance, instance_count, partitions):
    """(GPUs doing work, data-parallel size)."""
    gpus = max(instance.gpus, 1)
    if strategy == "single":
        return 1, 1
    total = gpus * instance_count
    if strategy == "smp":
        return total, total // partitions
    return total, total


def _evaluate(config, instance, instance_count, strategy, global_batch, seq_len, precision, recompute,
              partitions=1, microbatches=1, pipeline="interleaved"):
    """One layout's memory. Activations are counted op by op (the larger count, and what runs where
    XLA does not compile: lm.training.train then falls back to running without it)."""
    gpus_used, dp = _layout(strategy, instance, instance_count, partitions)
    per_replica = global_batch // dp
    micro_batch = max(per_replica // microbatches, 1)
    in_flight = 1
    if strategy == "smp":
        in_flight = min(microbatches, partitions) if pipeline == "interleaved" else microbatches
    mem = memory(config, micro_batch, seq_len, precision, recompute=recompute, partitions=partitions,
                 in_flight=in_flight, accumulate=strategy == "smp" and microbatches > 1)
    host = host_memory(config, instance, strategy, mem["peak"])
    return {"gpus_used": gpus_used, "data_parallel": dp, "per_replica_batch": per_replica,
            "micro_batch": micro_batch, "partitions": partitions, "microbatches": microbatches,
            "pipeline": pipeline, "memory": mem, "host_memory": host,
            "fits_gpu": mem["peak"] <= usable_bytes(instance),
            "fits": mem["peak"] <= usable_bytes(instance) and host["checkpoint_snapshot"] <= host["usable"]}


def _smp_search(config, instance, instance_count, global_batch, seq_len, precision, recompute,
                partitions=None, microbatches=None, pipeline=None):
    """The smallest partition count that fits, then the fewest microbatches that fit (at
    least 2 x partitions when the batch allows, so the pipeline bubble stays under a third),
    the interleaved pipeline before the simple one (it keeps at most `partitions` microbatches
    in flight, the simple one all of them). Given values are not searched. When nothing fits:
    the layout that needs the least memory."""
    tried = []
    for p in ([partitions] if partitions else [d for d in _divisors(instance.gpus) if d >= 2]):
        per_replica = global_batch // (instance.gpus * instance_count // p)
        fitting = []
        for line in ([pipeline] if pipeline else sorted(SMP_PIPELINES, key=lambda name: name != "interleaved")):
            for m in ([microbatches] if microbatches else _divisors(max(per_replica, 1))):
                result = _evaluate(config, instance, instance_count, "smp", global_batch, seq_len, precision,
                                   recompute, p, m, line)
                tried.append(result)
                if result["fits"] and per_replica >= 1:
                    fitting.append(result)
            if fitting:
                wide = [r for r in fitting if r["microbatches"] >= 2 * p]
                return wide[0] if wide else fitting[-1]
    return min(tried, key=lambda r: r["memory"]["peak"])


def _too_big(config, instance, instance_count, strategy, layout, batch, seq_len, precision, recompute, given_smp):
    """The reason a layout that does not fit is refused, with what fits instead where something does."""
    host = layout["host_memory"]
    if instance.gpus and layout["fits_gpu"]:
        return "its checkpoint snapshot needs %.1f GiB of the chief's host memory, %s has %.1f GiB for it " \
               "(%d GiB, less %g GiB for each of its %d training processes)" % (
                   host["checkpoint_snapshot"] / GIB, instance.name, host["usable"] / GIB, instance.memory_gib,
                   HOST_RESERVED_GIB, instance.gpus)
    snapshot = "" if instance.gpus or not host["checkpoint_snapshot"] else \
        " with its checkpoint snapshot (%.1f GiB)" % (host["checkpoint_snapshot"] / GIB)
    reason = "needs %.1f GiB per %s%s, %s has %.1f GiB usable (%d GiB %s)" % (
        (layout["memory"]["peak"] + (0 if instance.gpus else host["checkpoint_snapshot"])) / GIB,
        "GPU" if instance.gpus else "host", snapshot, instance.name, usable_bytes(instance) / GIB,
        instance.gpu_memory_gib or instance.memory_gib, instance.gpu or "host memory")
    nearest = _nearest_fit(config, instance, instance_count, strategy, batch, seq_len, precision, recompute, given_smp)
    return "%s; %s" % (reason, nearest) if nearest else reason


def _nearest_fit(config, instance, instance_count, strategy, batch, seq_len, precision, recompute, given_smp):
    """What fits when the requested layout does not, as a phrase for the rejection (None: nothing
    does): under SMP with some of partitions, microbatches and pipeline given, the searched ones at
    this sequence length; else the longest shorter sequence length (halving, down to
    SHORTEST_SEQ_LEN) at which a layout fits. A sequence length is the dataset's (lm.data.prepare's
    seq_len), so the plan names it instead of planning with it."""
    def layout_at(length):
        if strategy == "smp":
            return _smp_search(config, instance, instance_count, batch, length, precision, recompute)
        return _evaluate(config, instance, instance_count, strategy, batch, length, precision, recompute)

    def smp_phrase(layout):
        return " with partitions=%(partitions)d, microbatches=%(microbatches)d, pipeline=%(pipeline)s" % layout \
            if strategy == "smp" else ""

    if given_smp:
        layout = layout_at(seq_len)
        if layout["fits"]:
            return "fits%s (%.1f GiB)" % (smp_phrase(layout), layout["memory"]["peak"] / GIB)
    length = seq_len // 2
    while length >= SHORTEST_SEQ_LEN:
        layout = layout_at(length)
        if layout["fits"]:
            return "fits at seq_len %d%s (%.1f GiB), with a dataset prepared at that seq_len" % (
                length, smp_phrase(layout), layout["memory"]["peak"] / GIB)
        length //= 2
    return None


def allreduce_overlaps_backward(strategy, xla):
    """Whether the gradient all-reduce between replicas can run while the backward pass does, in
    the strategy's code path (lm.distributed); otherwise it starts when the backward pass ends.

    - horovod: `hvd.grouped_allreduce` of the gradient list is one op whose inputs are every
      gradient: it starts when the last one exists, XLA or not.
    - mwms: the replica context's `all_reduce` of the gradient list packs every gradient into one
      tensor first (CommunicationOptions' default bytes_per_pack 0: a single pack), XLA or not.
    - smp: the microbatches' gradients are accumulated, then averaged over the replicas.
    - smddp: `DistributedGradientTape` hands each gradient to the library as the backward pass
      makes it and the library reduces them while the pass goes on ("overlaps AllReduce with the
      backward pass", SMDDP's documentation) - without XLA. With XLA the backward pass is one
      compiled call, and every gradient appears when it returns.
    tests/training/test_plan_runtime.py checks these against the traced train steps."""
    return strategy == "smddp" and not xla


def assumed_mfu(gpu):
    """(MFU, its source) the planner assumes on `gpu` (a name of lm.spec.hardware.GPUS): lmstack's own
    measurement where bench/gpu.py recorded one (MEASURED_MFU), else the published figure."""
    measured = MEASURED_MFU.get(gpu)
    if measured:
        return measured["mfu"], "measured by bench/gpu.py: %s, %s, XLA %s, batch %d x %d, %s, TensorFlow %s, %s" % (
            measured["preset"], measured["precision"], "on" if measured["xla"] else "off", measured["batch"],
            measured["seq_len"], measured["device"], measured["tensorflow"], measured["date"])
    return throughput.PUBLISHED_MFU[gpu]


def _timing(config, instance, instance_count, strategy, layout, seq_len, precision, recompute, xla, tokens, mfu,
            traffic_encryption=False, usd_per_instance_hour=None):
    gpu = hardware.get_gpu(instance.gpu) if instance.gpus else None
    if gpu is None:
        return None
    mfu, mfu_source = assumed_mfu(gpu.name) if mfu is None else (mfu, "given")
    flops = flops_per_token(config, seq_len)
    efficiency = 1.0
    if strategy == "smp":
        m, p = layout["microbatches"], layout["partitions"]
        efficiency = m / float(m + p - 1)
    if recompute:  # the blocks' forward runs twice
        efficiency *= step_flops(config, 1, seq_len) / float(step_flops(config, 1, seq_len, recompute=True))
    tokens_per_s = layout["gpus_used"] * gpu.peak_flops[precision] * mfu * efficiency / flops
    step_tokens = layout["per_replica_batch"] * layout["data_parallel"] * seq_len
    compute_s = step_tokens / tokens_per_s
    allreduce_s = 0.0
    if instance_count > 1 and layout["data_parallel"] > 1:
        bandwidth = throughput.NETWORK_GBPS[instance.name] * 1e9 / 8 * NETWORK_EFFICIENCY
        allreduce_s = 2.0 * (instance_count - 1) / instance_count * 4 * parameter_count(config) / bandwidth
        if traffic_encryption:
            allreduce_s *= ENCRYPTED_ALLREDUCE_SLOWDOWN
    overlapped = allreduce_overlaps_backward(strategy, xla)
    step_s = max(compute_s, allreduce_s) if overlapped else compute_s + allreduce_s
    hours = tokens / (step_tokens / step_s) / 3600.0
    # A training plan's reserved capacity is paid at the plan's price, not on-demand; an instance
    # type without a sourced price (prices.UNPRICED) gets no cost.
    price = prices.on_demand_price(instance.name) if usd_per_instance_hour is None else usd_per_instance_hour
    on_demand = None if price is None else hours * instance_count * price
    return collections.OrderedDict([
        ("mfu", mfu), ("mfu_source", mfu_source), ("peak_flops_per_gpu", gpu.peak_flops[precision]), ("flops_per_token", flops),
        ("pipeline_efficiency", efficiency), ("tokens_per_second", step_tokens / step_s),
        ("step_seconds", step_s), ("compute_seconds", compute_s), ("allreduce_seconds", allreduce_s),
        ("allreduce_overlaps_backward", overlapped),
        ("steps", int(math.ceil(tokens / float(step_tokens)))), ("hours", hours),
        ("cost_on_demand_usd", on_demand), ("cost_spot_usd", prices.spot_cost(on_demand)),
        ("lost_seconds_per_interruption", lost_seconds_per_interruption(step_s)),
    ])


def lost_seconds_per_interruption(step_seconds, checkpoint_minutes=None, checkpoint_every=None):
    """Training time an interruption throws away on average: half the time between periodic
    checkpoints (the sooner of lm.training.train's `checkpoint_minutes` and `checkpoint_every` steps;
    defaults from lm.spec.job), since nothing is saved at the kill. Restart time comes on top."""
    minutes = job.HYPERPARAMETERS["checkpoint_minutes"].default if checkpoint_minutes is None else checkpoint_minutes
    steps = job.HYPERPARAMETERS["checkpoint_every"].default if checkpoint_every is None else checkpoint_every
    if steps == interruptions.AUTO:  # an interval of time, planned with the save and the interruptions
        steps = 0  # (controlplane.checkpoint_plan); checkpoint_minutes still bounds it
    intervals = [seconds for seconds in (minutes * 60.0, steps * step_seconds) if seconds > 0]
    return min(intervals) / 2.0 if intervals else None


def nearest_multiple(value, unit):
    """The positive multiple of `unit` nearest to `value` (the larger one on a tie)."""
    lower = value // unit * unit
    return lower if lower >= 1 and value - lower < lower + unit - value else lower + unit


def batch_unit(layout, strategy, microbatches):
    """What the global batch must be a multiple of for the runtime to accept it: lm.data.dataset.TokenStream
    splits it evenly over the data-parallel replicas (under MWMS each worker then splits its share
    evenly over its GPUs: the plan's replicas are the GPUs), and under SMP each replica's share
    splits into `microbatches` when they are given (searched ones divide it by construction)."""
    return layout["data_parallel"] * (microbatches if strategy == "smp" and microbatches else 1)


def picked_batch_warning(requested, picked, unit, with_microbatches):
    return ("global_batch %d is not a multiple of %d (the data-parallel size%s), which the runtime requires: "
            "planned with the nearest valid one, %d; set hyperparameters.global_batch_size to %d" % (
                requested, unit, " x microbatches" if with_microbatches else "", picked, picked))


def _smp_parameters(layout):
    """The mp_parameters that run an SMP layout as it was counted."""
    parameters = collections.OrderedDict([
        ("partitions", layout["partitions"]), ("microbatches", layout["microbatches"]),
        ("pipeline", layout["pipeline"])])
    if layout["data_parallel"] > 1:
        # SMP v1 for TensorFlow averages gradients across model replicas with Horovod only.
        parameters["horovod"] = True
    if layout["partitions"] > 1:
        # The placement counted is made with smp.partition, which the library keeps only under
        # manual partitioning (lm.distributed.smp.placement_problem).
        parameters.update(auto_partition=False, default_partition=0)
    return parameters


def plan(model, instance_type, instance_count=1, strategy="auto", *, global_batch=None, seq_len=None,
         precision="auto", recompute=False, xla=XLA_DEFAULT, tokens=None, mfu=None, spot=False,
         partitions=None, microbatches=None, pipeline=None, learning_rate=0.0, scale_lr=SCALE_LR_DEFAULT,
         traffic_encryption=False, usd_per_instance_hour=None, on_demand=None):
    """Everything `python -m lmstack.plan` prints, as a dict. `model` is a preset name or a model config
    of any family (`lm.spec.families`);
    `global_batch` in sequences (default lm.spec.job's), `tokens` the training budget (default 20 per
    parameter); strategy "auto" picks the cheapest strategy that fits. `xla`: whether lm.training.train
    compiles the step with XLA (its hyperparameter; it decides when the all-reduce runs). SMP's
    `partitions`, `microbatches` and `pipeline` are searched where not given. `traffic_encryption`:
    the job's EnableInterContainerTrafficEncryption (ENCRYPTED_ALLREDUCE_SLOWDOWN on the all-reduce).
    `usd_per_instance_hour` replaces the on-demand price (a SageMaker training plan's price). `on_demand`: the
    on-demand price of the type for training (a `controlplane.pricing.Price`, such as the AWS Price List's; default
    the table's)."""
    config = resolve_config(model)
    instance = hardware.get_instance(instance_type)
    if not isinstance(instance_count, int) or isinstance(instance_count, bool) or instance_count < 1:
        raise ValueError("instance_count must be a positive integer, got %r" % (instance_count,))
    if strategy != "auto" and strategy not in job.STRATEGIES:
        raise _field_error("strategy", ("auto",) + job.STRATEGIES, strategy)
    if pipeline is not None and pipeline not in SMP_PIPELINES:
        raise _field_error("pipeline", SMP_PIPELINES, pipeline)
    seq_len = config.block_size if not seq_len else seq_len
    if seq_len > config.block_size:
        raise ValueError("seq_len %d exceeds the model's block_size %d" % (seq_len, config.block_size))
    global_batch = DEFAULT_GLOBAL_BATCH if global_batch is None else global_batch
    if global_batch < 1:
        raise ValueError("global_batch must be at least 1 sequence, got %r" % (global_batch,))
    if mfu is not None and not 0.0 < mfu <= 1.0:
        raise ValueError("mfu must be in (0, 1], got %r" % (mfu,))
    precision = resolve_precision(precision, instance)
    params = parameter_count(config)
    tokens = TOKENS_PER_PARAMETER * params if tokens is None else tokens
    on_demand = on_demand or pricing.from_table(instance_type, pricing.TRAINING, prices.PRICE_REGION)

    def one(name, recompute):
        reason = cannot_run(name, instance_type, instance_count, recompute, config.family)
        runnable = reason is None
        searchable = name == "smp" and instance.gpus >= 2
        if searchable and partitions and (partitions < 2 or instance.gpus % partitions):
            searchable = False
            reason = reason or "partitions must be a divisor of the %d GPUs per host, at least 2; got %d" % (
                instance.gpus, partitions)

        def layout_for(batch):
            if searchable:  # also where a rule refuses the run: the layout shows what it would hold
                return _smp_search(config, instance, instance_count, batch, seq_len, precision, recompute,
                                   partitions, microbatches, pipeline)
            return _evaluate(config, instance, instance_count, name, batch, seq_len, precision, recompute)

        layout = layout_for(global_batch)
        warnings = []
        batch = global_batch
        unit = batch_unit(layout, name, microbatches)
        if reason is None and global_batch % unit:
            # The runtime refuses it: plan the nearest batch it accepts, and say so.
            batch = nearest_multiple(global_batch, unit)
            layout = layout_for(batch)
            warnings.append(picked_batch_warning(global_batch, batch, unit, name == "smp" and microbatches))
            if batch % batch_unit(layout, name, microbatches):  # SMP searched another partition count
                reason = "global_batch %d is not a multiple of %d (the data-parallel size of the layout that fits), " \
                         "which the runtime requires" % (batch, batch_unit(layout, name, microbatches))
        if reason is None and not layout["fits"]:
            reason = _too_big(config, instance, instance_count, name, layout, batch, seq_len, precision, recompute,
                              searchable and any((partitions, microbatches, pipeline)))
        if name == "single" and instance.gpus > 1:
            warnings.append("single uses 1 of the %d GPUs of %s" % (instance.gpus, instance_type))
        timing = None
        if layout["per_replica_batch"] >= 1:
            timing = _timing(config, instance, instance_count, name, layout, seq_len, precision, recompute,
                             xla, tokens, mfu, traffic_encryption,
                             on_demand.usd_per_hour if usd_per_instance_hour is None else usd_per_instance_hour)
        if timing and timing["allreduce_seconds"] > timing["compute_seconds"]:
            needed = int(math.ceil(batch * timing["allreduce_seconds"] / timing["compute_seconds"]))
            warnings.append(
                "global batch too small for %d data-parallel replicas on %d hosts: the all-reduce (%.2f s) "
                "outlasts the compute (%.2f s) of a step; use a global batch of at least %d sequences" % (
                    layout["data_parallel"], instance_count, timing["allreduce_seconds"],
                    timing["compute_seconds"], needed))
        result = collections.OrderedDict([("strategy", name), ("ok", reason is None), ("reason", reason),
                                          ("runnable", runnable), ("recompute", recompute),
                                          ("runtime", base_images.STRATEGY_RUNTIME[name])])
        result["global_batch"] = batch
        result.update((key, layout[key]) for key in ("gpus_used", "data_parallel", "per_replica_batch",
                                                     "micro_batch", "fits"))
        if name == "smp":
            result["mp_parameters"] = _smp_parameters(layout)
        result["memory_gib"] = collections.OrderedDict(
            (key, value / GIB) for key, value in layout["memory"].items() if key != "params")
        result["params_per_gpu"] = layout["memory"]["params"]
        result["usable_gib"] = usable_bytes(instance) / GIB
        result["host_memory_gib"] = collections.OrderedDict(
            (key, value / GIB) for key, value in layout["host_memory"].items())
        result["time"] = timing
        result["warnings"] = warnings
        return result

    candidates = [one(name, recompute) for name in job.STRATEGIES]
    # What the other recompute setting would make possible (recomputation saves memory; smp refuses
    # it), so a suggestion can include it.
    alternatives = [one(name, not recompute) for name in job.STRATEGIES]
    suggestion = _preferred(candidates, alternatives)
    if strategy == "auto":
        # Nothing fits: show the runnable strategy closest to fitting, and why it does not fit.
        runnable = [c for c in candidates if c["runnable"]]
        chosen = suggestion or min(runnable or candidates, key=lambda c: c["memory_gib"]["peak"])
    else:
        chosen = next(c for c in candidates if c["strategy"] == strategy)
    out = collections.OrderedDict([
        ("model", collections.OrderedDict([
            ("params", params), ("family", config.family), ("n_layer", config.n_layer), ("d_model", config.d_model),
            ("vocab", config.padded_vocab_size),
            ("flops_per_token", flops_per_token(config, seq_len)),
            ("step_flops", step_flops(config, global_batch, seq_len, recompute))])),
        ("instance", collections.OrderedDict([
            ("type", instance_type), ("count", instance_count), ("gpus_per_host", instance.gpus),
            ("gpu", instance.gpu), ("gpu_memory_gib", instance.gpu_memory_gib),
            ("interconnect", instance.interconnect), ("network_gbps", throughput.NETWORK_GBPS.get(instance_type)),
            ("on_demand_usd_per_hour", on_demand.usd_per_hour), ("usd_per_instance_hour", usd_per_instance_hour),
            ("price_region", on_demand.region), ("price_date", on_demand.effective_date),
            ("price_source", on_demand.source), ("price_note", on_demand.note)])),
        ("settings", collections.OrderedDict([
            ("strategy", strategy), ("global_batch", global_batch), ("seq_len", seq_len),
            ("precision", precision), ("recompute", recompute), ("xla", xla), ("tokens", tokens),
            ("spot", spot)])),
        ("learning_rate", learning_rate_plan(config, chosen["global_batch"], learning_rate, scale_lr)),
        ("chosen", chosen),
        ("ok", chosen["ok"]),
        ("suggested_strategy", suggestion["strategy"] if suggestion else None),
        ("suggested_recompute", suggestion["recompute"] if suggestion else None),
        ("suggested", suggestion),
        ("fits_with_recompute", (chosen["ok"] and recompute) or any(
            c["ok"] for c in alternatives if c["strategy"] == chosen["strategy"] and c["recompute"])),
        ("candidates", candidates),
    ])
    return out


def learning_rate_plan(config, global_batch, learning_rate, scale_lr):
    """The peak learning rate lm.training.train will use (`lm.spec.families.peak_learning_rate`) and what it comes from."""
    gpt3_rate, gpt3_batch = gpt3_training(config)
    return collections.OrderedDict([
        ("peak", peak_learning_rate(config, global_batch, learning_rate, scale_lr)),
        ("given", learning_rate or None), ("gpt3_rate", gpt3_rate), ("gpt3_batch", gpt3_batch),
        ("scale_lr", scale_lr), ("global_batch", global_batch)])


def _preferred(candidates, alternatives):
    """The run to suggest: the cheapest that fits without SMP, with the recompute setting asked for,
    else with the other one; SMP only where no other strategy fits, that is where the state (16
    bytes a parameter and more) does not fit one GPU. SMP v1 runs only on the oldest image, cannot
    recompute, and its pipeline's cost is the part of this model that no run here has measured."""
    def without_smp(pool):
        return [c for c in pool if c["strategy"] != "smp"]

    return (_cheapest(without_smp(candidates)) or _cheapest(without_smp(alternatives)) or _cheapest(candidates)
            or _cheapest(alternatives))


def _cheapest(candidates):
    fitting = [c for c in candidates if c["ok"] and c["time"] is not None]
    if fitting:
        # Without a price (prices.UNPRICED) every candidate costs None: rank those by hours.
        return min(fitting, key=lambda c: (c["time"]["cost_on_demand_usd"] or 0.0, c["time"]["hours"],
                                           job.STRATEGIES.index(c["strategy"])))
    ok = [c for c in candidates if c["ok"]]
    return ok[0] if ok else None


# ---- what the state machine and the execution output use ----

Verdict = collections.namedtuple("Verdict", "ok reason suggested_strategy suggestion plan")


def check(preset, instance_type, instance_count=1, strategy="auto", **settings):
    """Can this run fit and run? A Verdict: ok, reason (None when ok), the cheapest strategy
    that fits (None if none does), a one-line suggestion, and the full plan."""
    result = plan(preset, instance_type, instance_count, strategy, **settings)
    chosen, best = result["chosen"], result["suggested"]
    suggested = best["strategy"] if best else None
    if result["ok"]:
        return Verdict(True, None, suggested, None, result)
    reason = "%s on %d x %s: %s" % (chosen["strategy"], instance_count, instance_type, chosen["reason"])
    if best is None:
        hint = "no strategy fits on %s: use a GPU with more memory or a smaller global batch" % instance_type
    else:
        hints = []
        if suggested != chosen["strategy"]:
            hints.append(use_strategy(best))
        if best["recompute"] != result["settings"]["recompute"]:
            hints.append("set recompute=%s" % str(best["recompute"]).lower())
        if best["global_batch"] != result["settings"]["global_batch"]:
            hints.append("set global_batch_size=%d (a multiple of its data-parallel size)" % best["global_batch"])
        hint = " and ".join(hints)
    return Verdict(False, reason, suggested, hint, result)


def use_strategy(candidate):
    """"use strategy X" for a plan's candidate, with SMP's partitions and microbatches."""
    if candidate["strategy"] == "smp":
        return "use strategy smp with partitions=%(partitions)d, microbatches=%(microbatches)d" \
            % candidate["mp_parameters"]
    return "use strategy %s" % candidate["strategy"]


def gpu_instance_types():
    return [name for name, instance in hardware.INSTANCES.items() if instance.gpus]


# feasibility_table's rows per fingerprint of what they are computed from: 2,640 plans take about 2 s,
# and every build of the training definition (a synth, each state machine test) asks for them.
_FEASIBILITY = {}


def _tables_fingerprint(seq_len):
    """The text of everything the feasibility rows depend on that a fork or a test can change in a
    running process: the presets, the upper-case tables of this module, lm.spec.hardware,
    lm.spec.job and controlplane.prices, the job rules and the families' declarations. The
    rows are recomputed whenever it changes."""
    modules = [globals()] + [vars(module) for module in (hardware, job, prices)]
    tables = [sorted((name, repr(value)) for name, value in variables.items()
               if name.isupper() and not name.startswith("_")) for variables in modules]
    return repr((seq_len, tables, sorted(ALL_PRESETS.items(), key=lambda item: item[0]), job.job_rules(),
                 sorted(FAMILIES.items())))


def feasibility_table(seq_len=TABLE_SEQ_LEN):
    """`_feasibility_table`'s rows, computed once per state of the tables they depend on; fresh copies."""
    key = _tables_fingerprint(seq_len)
    if key not in _FEASIBILITY:
        _FEASIBILITY.clear()
        _FEASIBILITY[key] = _feasibility_table(seq_len)
    return [collections.OrderedDict(row) for row in _FEASIBILITY[key]]


def _feasibility_table(seq_len):
    """One row per preset (of every family) x GPU instance type x strategy: can the smallest possible run fit and
    run (one instance, one sequence of `seq_len` tokens per data-parallel replica, precision
    auto, recomputation allowed where the strategy takes it: not with smp)? A combination that
    fails here fails for every batch size.

    Row keys: preset, instance_type, strategy, ok, recompute_required (fits only with
    recompute=true), reason (None when ok), suggested_strategy (when not ok: the cheapest
    strategy that fits on this instance type, None when none does), suggestion (a sentence)."""
    rows = []
    for preset in ALL_PRESETS:
        length = min(seq_len, get_preset(preset).block_size)
        for instance_type in gpu_instance_types():
            gpus = hardware.get_instance(instance_type).gpus
            verdicts = collections.OrderedDict()
            for strategy in job.STRATEGIES:
                # One sequence per replica: one per GPU under data parallelism; under SMP one for
                # the whole host (SMP searches its partitions: one replica of all the GPUs is the least).
                batch = gpus if strategy in DATA_PARALLEL else 1
                verdicts[strategy] = check(preset, instance_type, 1, strategy, global_batch=batch, seq_len=length)
            fitting = [verdict for verdict in verdicts.values() if verdict.ok or verdict.plan["fits_with_recompute"]]
            for strategy, verdict in verdicts.items():
                fits_with_recompute = verdict.plan["fits_with_recompute"]
                ok = verdict.ok or fits_with_recompute
                best = verdict.plan["suggested"]
                suggestion = verdict.suggestion
                if not ok and best is None and fitting:
                    # Each strategy's smallest run has its own batch: one that fits there is the way out.
                    best = fitting[0].plan["chosen"]
                    suggestion = "%s (it fits one sequence per model replica)" % use_strategy(best)
                rows.append(collections.OrderedDict([
                    ("preset", preset), ("instance_type", instance_type), ("strategy", strategy),
                    ("ok", ok), ("recompute_required", not verdict.ok and fits_with_recompute),
                    ("reason", None if ok else verdict.reason),
                    ("suggested_strategy", None if ok or best is None else best["strategy"]),
                    ("suggestion", None if ok else suggestion)]))
    return rows


def estimate(preset, instance_type, instance_count=1, strategy="auto", **settings):
    """The plan's headline for the execution output: hours, on-demand and spot $, tokens/s."""
    result = plan(preset, instance_type, instance_count, strategy, **settings)
    timing = result["chosen"]["time"] or {}
    return collections.OrderedDict([
        ("strategy", result["chosen"]["strategy"]), ("ok", result["ok"]),
        ("hours", timing.get("hours")), ("seconds", timing["hours"] * 3600 if timing else None),
        ("billable_instance_seconds", timing["hours"] * 3600 * instance_count if timing else None),
        ("cost_on_demand_usd", timing.get("cost_on_demand_usd")), ("cost_spot_usd", timing.get("cost_spot_usd")),
        ("tokens_per_second", timing.get("tokens_per_second")), ("tokens", result["settings"]["tokens"]),
        ("price_region", prices.PRICE_REGION), ("price_date", prices.price_date(instance_type)),
        ("spot_basis", prices.SPOT_BASIS)])
