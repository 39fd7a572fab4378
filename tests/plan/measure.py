"""Measure training steps on the CPU: allocator peak bytes, executed matmul FLOPs, parameters.

Run as a script (a fresh process: the allocator choice must be made before TensorFlow starts):

    python tests/plan/measure.py '{"config": {...}, "batch": 8, "seq_len": 64, "recompute": false}'

Prints one JSON line. How it measures:
- step: `compute_gradients` then `apply_update` of lm.distributed.base (AdamW, clipping 1.0),
  as the single-device train step composes them.
- memory: TF_CPU_ALLOCATOR_USE_BFC=true makes TensorFlow's CPU allocator the BFC allocator,
  which keeps statistics, so `tf.config.experimental.get_memory_info("CPU:0")` works on the
  CPU (it raises with the default allocator). One warm-up step creates and traces
  everything; then MEASURED_STEPS steps run, the peak reset before each. A step's peak counts
  every live tensor: weights, AdamW's m and v, gradients, activations and temporaries; the
  median of the steps is reported (see threads). TensorFlow's own CPU kernels run, not oneDNN's
  rewrites (TF_ENABLE_ONEDNN_OPTS=0, below).
- threads: two inter-op threads (TensorFlow's default on 2 cores). TF's executor hands the ops it
  has timed as expensive to its inter-op pool, whose workers run the newest first; with a single
  worker nothing takes the older ones, so reductions such as the bias gradients and the tied
  embedding's weight gradient wait for the end of the backward pass and their inputs stay alive
  (a block's 9 u and the 4 z logits gradient). Which ops are queued follows the op timings, so
  under recomputation the peak varied from 184 to 252 MiB between processes for the 4-layer
  case (profiled with TensorFlow's memory profiler). With a second worker the queued ops run as
  they become ready, as on a GPU, whose kernels TensorFlow marks inexpensive and runs inline in
  that order (OpKernel's constructor, tensorflow/core/framework/op_kernel.cc): 159 to 178 MiB a
  step, except in the steps (about one in fifteen) where both workers are busy long enough for
  the queue to wait again (up to 210 MiB). The median of MEASURED_STEPS steps leaves those out.
- FLOPs: the graph of `lm.distributed.base.compute_gradients` (forward and backward) is
  traced and every MatMul, BatchMatMulV2 and Einsum op is counted from its static shapes
  (2 x the product of all distinct dimension sizes of a two-operand einsum).
  (An RNN's recurrent matmuls run inside a while loop's body, which this count does not enter.)
- parameters: the built model's trainable variables, summed.
- with "snapshot": after those measured steps, lm.checkpoint's snapshot of the state
  (weights, m, v: `host_snapshot`) is taken and held, as a background save holds it until its
  writer has written the file; one step runs, then the measured ones again: `peak_bytes` is their
  peak on TensorFlow's allocator, `plain_peak_bytes` the first ones', and `snapshot_host_bytes`
  what the snapshot holds outside it (NumPy arrays). Both peaks in one process, so they run the
  same graphs: the peaks of two processes differ by a few MiB.
"""
import json
import os
import sys

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
# TensorFlow's own CPU kernels, not oneDNN's rewrites: its fused batch matmul takes seconds a call in the
# recomputed graph on this CPU (a 4-layer recompute step 7 to 14 s instead of 1); the peaks of every case
# here are the same within 1.5 % either way, and a GPU runs neither.
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

from lm import checkpoint
from lm.compat import tf  # noqa: E402
from lm import models
from lm.distributed.base import apply_update, compute_gradients  # noqa: E402
from lm.training.optim import AdamW


def loss_fn(labels, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def _dims(tensor):
    return [int(d) for d in tensor.shape]


def op_flops(op):
    if op.type == "MatMul":
        a, b = _dims(op.inputs[0]), _dims(op.inputs[1])
        k = a[0] if op.get_attr("transpose_a") else a[1]
        n = b[0] if op.get_attr("transpose_b") else b[1]
        return 2 * (a[1] if op.get_attr("transpose_a") else a[0]) * k * n
    if op.type in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        out = _dims(op.outputs[0])
        a = _dims(op.inputs[0])
        k = a[-2] if op.get_attr("adj_x") else a[-1]
        total = 2 * k
        for d in out:
            total *= d
        return total
    if op.type == "Einsum":
        equation = op.get_attr("equation").decode()
        operands = equation.split("->")[0].split(",")
        if len(operands) != 2:
            return 0
        sizes = {}
        for letters, tensor in zip(operands, op.inputs):
            for letter, size in zip(letters, _dims(tensor)):
                sizes[letter] = size
        total = 2
        for size in sizes.values():
            total *= size
        return total
    return 0


MEASURED_STEPS = 3


def measured_peak(step, inputs, labels):
    """The median allocator peak of MEASURED_STEPS steps."""
    peaks = []
    for _ in range(MEASURED_STEPS):
        tf.config.experimental.reset_memory_stats("CPU:0")
        step(inputs, labels)
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    return sorted(peaks)[MEASURED_STEPS // 2]


def main():
    spec = json.loads(sys.argv[1])
    tf.config.threading.set_inter_op_parallelism_threads(2)  # see the module docstring
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.random.set_seed(0)
    config = models.config_from_dict(spec["config"]["family"], spec["config"])
    batch, seq_len = spec["batch"], spec["seq_len"]
    model = models.build(config, recompute=spec.get("recompute", False))
    params = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
    optimizer = AdamW(model.trainable_variables, lambda step: 1e-4)
    # autograph=False: the step branches on no tensor, so it traces the same graph as with autograph (node for node in
    # every case of tests/plan/test_measured.py), without the seconds autograph spends converting the Keras code.
    forward_backward = tf.function(lambda x, y: compute_gradients(model, loss_fn, x, y),
                                   jit_compile=spec.get("xla", False), autograph=False)

    @tf.function(autograph=False)
    def step(x, y):  # what the single-device train step of lm.distributed.base does
        loss, grads = forward_backward(x, y)
        apply_update(optimizer, model.trainable_variables, grads, grad_clip=1.0)
        return loss

    inputs = tf.random.uniform([batch, seq_len], maxval=config.vocab_size, dtype=tf.int32, seed=1)
    labels = tf.random.uniform([batch, seq_len], maxval=config.vocab_size, dtype=tf.int32, seed=2)
    step(inputs, labels)
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    peak = measured_peak(step, inputs, labels)
    result = {}
    if spec.get("snapshot"):
        held = checkpoint.host_snapshot(list(model.weights) + optimizer.variables)
        step(inputs, labels)
        result["plain_peak_bytes"], peak = peak, measured_peak(step, inputs, labels)
        result["snapshot_host_bytes"] = sum(array.nbytes for array in held)

    graph = forward_backward.get_concrete_function(inputs, labels).graph  # the step's own trace, not traced again
    flops = sum(op_flops(op) for op in graph.get_operations())
    result.update(peak_bytes=peak, resident_bytes=before, params=params, matmul_flops=flops)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
