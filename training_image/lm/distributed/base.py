"""The one interface every distribution strategy implements.

`lm.training.train` talks to a `Strategy` and to nothing else that is strategy-specific. Its life:

    strategy = lm.distributed.get_strategy(name)   # constructing does nothing
    strategy.setup()                               # init the library, pin the GPU
    model = strategy.build_model(lambda: lm.models.build(config))
    with strategy.scope():
        optimizer = lm.training.optim.AdamW(...)            # creates its slots eagerly
    train_step = strategy.build_train_step(model, optimizer, loss_fn, ...)
    eval_step = strategy.build_eval_step(model, loss_fn, ...)
    restore the checkpoint rank 0 chooses (every rank reads it), then per step:
        metrics = train_step(inputs, labels)       # inputs, labels: this data-parallel rank's batch
        after the first step of this process: strategy.broadcast_initial_state(model, optimizer)
    only ranks with `writes_checkpoints` save; only `is_chief` prints and exports.

The batch a train step receives is what this process's input pipeline delivers:
`global_batch_size // data_parallel_size` sequences. An adapter that drives several devices
from one process (MWMS with several local GPUs) splits that batch over them itself.

What an adapter must do (override only what differs from the single-device defaults):
- `setup()`: initialise its library exactly once, then set `rank`, `size`, `local_rank`,
  `local_size` (`take_ranks_from(library)`), and pin this process to GPU `local_rank` (`pin_gpu`) when it runs one process
  per GPU. Return self.
- `data_parallel_rank` / `data_parallel_size`: which disjoint slice of the data this process
  reads, out of how many. Equal to rank/size except under model parallelism, where all
  ranks of one model replica share a data-parallel rank (SMP: `smp.dp_rank()`, `smp.dp_size()`).
- `scope()`: the context variables must be created in (MWMS: `strategy.scope()`).
- `build_model(build_fn)`: return the Keras model `build_fn()` builds, created in `scope()`
  (SMP: wrapped as an `smp.DistributedModel`).
- `reduce_gradients(grads)`: the mean of each gradient over all data-parallel replicas, as a
  list in the same order (Horovod: `hvd.grouped_allreduce(op=hvd.Average)`, which is what
  `hvd.DistributedGradientTape` does). Adapters whose all-reduce happens elsewhere (MWMS
  inside `strategy.run`, SMP inside `@smp.step`) override `build_train_step` instead.
- `allreduce_mean(value)`: the mean of a float32 scalar tensor or Python float over all
  data-parallel replicas, inside a train/eval step's graph and eagerly from the loop
  (`lm.training.train` uses it to agree on stopping after SIGTERM).
- `devices`: how many devices all processes drive together (MFU's denominator).
- `build_train_step(...)`: a callable `(inputs, labels) -> {"loss", "grad_norm", "loss_scale", "applied"}`
  of float32 scalars that does forward, backward, gradient all-reduce, clipping and the
  optimizer update, skipped where the reduced loss or gradient norm is not finite (`apply_update`).
  "loss" is the mean over the GLOBAL batch; every replica applies the same averaged gradient, so
  weights stay identical everywhere. The default composes `compute_gradients` (XLA-compiled when `jit_compile`) with `reduce_gradients` and
  `apply_update`; an override must keep that meaning.
- `build_eval_step(...)`: `(inputs, labels) -> loss`, the mean over the global batch.
- `broadcast_initial_state(model, optimizer)`: make every rank's weights and optimizer state
  equal rank 0's (Horovod: `hvd.broadcast_variables`). Called once, after the first step, when
  the optimizer's variables exist. A no-op where variables are mirrored by construction.
- `broadcast_restored_state(model, optimizer)`: after a rollback restored the checkpoint on the ranks that
  write checkpoints, make every rank's state theirs (by default `broadcast_initial_state`).
- `checkpoints(directory)`: where and how this strategy's checkpoints are kept (`Checkpoints`:
  lm.checkpoint's .npz files, written by the ranks with `writes_checkpoints`; SMP: its own).
- `choose_checkpoint(newest_step)`: the step every rank resumes from: rank 0's newest, sent to
  every rank with the library's collective (`broadcast_step`). Ranks on different hosts see
  different checkpoint directories (SageMaker syncs each host's with S3), so no rank picks its own.
- `whole_model(model)`: called on every rank before the export; the complete model on the
  chief (SMP: the partitions gathered from the model-parallel group).
- `barrier()`: return when every rank has called it.
- `writes_checkpoints`: which ranks save (the chief by default; SMP: one rank per partition).
- `shutdown()`: release the library at the end (optional).
"""
import contextlib

from lm import checkpoint
from lm.compat import tf

# Steps travel as float32 through collectives that reduce floats: exact below 2**24.
LARGEST_STEP = 2 ** 24 - 2


def pin_gpu(local_rank):
    """Make only GPU `local_rank` visible to this process (memory grows on demand)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    if local_rank >= len(gpus):
        raise RuntimeError("local rank %d but only %d GPUs visible" % (local_rank, len(gpus)))
    gpu = gpus[local_rank]
    tf.config.set_visible_devices(gpu, "GPU")
    tf.config.experimental.set_memory_growth(gpu, True)


def compute_gradients(model, loss_fn, inputs, labels, loss_scale=None):
    """Forward and backward on one replica's batch: (loss, gradients), gradients unscaled.

    `loss_fn(labels, logits)` returns the mean loss over the batch's tokens. With a loss
    scale (float16), the loss is multiplied by it before the backward pass and the gradients
    divided by it afterwards, so small gradients survive in float16.
    """
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        logits = model(inputs, training=True)
        loss = tf.cast(loss_fn(labels, logits), tf.float32)
        scaled = loss_scale.scale(loss) if loss_scale is not None else loss
    # Dense gradients: embedding lookups give IndexedSlices, which all-reduce and update slowly.
    grads = [tf.convert_to_tensor(grad) for grad in tape.gradient(scaled, variables)]
    if loss_scale is not None:
        grads = loss_scale.unscale(grads)
    return loss, grads


def apply_update(optimizer, variables, grads, grad_clip=0.0, loss_scale=None, grad_norm=None, loss=None):
    """Clip by global norm, then apply unless the step is not finite (lm.training.divergence): the global
    gradient norm, or `loss` (the all-reduced loss), is inf or nan. Every replica decides on the same
    reduced values, so all skip together; with a loss scale an overflow also halves the scale.

    Returns {"grad_norm", "loss_scale", "applied"} ("applied": 1.0 or 0.0). The same averaged gradients
    give the same update on every replica. `grad_norm`: the norm of the whole model's gradients when
    `grads` are only this process's share of them (SMP partitions); by default the norm of `grads`.
    """
    if grad_norm is None:
        grad_norm = tf.linalg.global_norm(grads)
    if grad_clip and grad_clip > 0:
        grads, _ = tf.clip_by_global_norm(grads, grad_clip, use_norm=grad_norm)
    finite_grads = tf.math.is_finite(grad_norm)
    finite = finite_grads if loss is None else tf.logical_and(finite_grads, tf.math.is_finite(loss))
    optimizer.apply_gradients(grads, variables, apply=finite)
    metrics = {"grad_norm": grad_norm, "applied": tf.cast(finite, tf.float32), "loss_scale": tf.constant(1.0)}
    if loss_scale is not None:
        loss_scale.update(finite_grads)
        metrics["loss_scale"] = tf.identity(loss_scale.value)
    return metrics


class Strategy:
    """Single process, single device. Adapters subclass it and override what differs."""

    name = "single"

    def __init__(self):
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.local_size = 1

    def setup(self):
        pin_gpu(self.local_rank)
        return self

    def take_ranks_from(self, library):
        """rank, size, local_rank, local_size from an initialized Horovod-style library (hvd, sdp, smp)."""
        self.rank, self.size = library.rank(), library.size()
        self.local_rank, self.local_size = library.local_rank(), library.local_size()

    @property
    def is_chief(self):
        return self.rank == 0

    @property
    def data_parallel_rank(self):
        return self.rank

    @property
    def data_parallel_size(self):
        return self.size

    @property
    def devices(self):
        """Accelerators (or CPUs) all processes drive together: the denominator of MFU."""
        return self.size

    @property
    def writes_checkpoints(self):
        return self.is_chief

    def scope(self):
        return contextlib.nullcontext()

    def build_model(self, build_fn):
        with self.scope():
            return build_fn()

    def reduce_gradients(self, grads):
        return list(grads)

    def allreduce_mean(self, value):
        return value

    def build_train_step(self, model, optimizer, loss_fn, *, grad_clip=0.0, loss_scale=None, jit_compile=False):
        """(inputs, labels) -> {"loss", "grad_norm", "loss_scale", "applied"}; see the module docstring."""
        forward_backward = tf.function(
            lambda inputs, labels: compute_gradients(model, loss_fn, inputs, labels, loss_scale),
            jit_compile=jit_compile, autograph=False)

        @tf.function(autograph=False)
        def train_step(inputs, labels):
            loss, grads = forward_backward(inputs, labels)
            grads = self.reduce_gradients(grads)
            loss = self.allreduce_mean(loss)
            metrics = apply_update(optimizer, model.trainable_variables, grads, grad_clip, loss_scale, loss=loss)
            metrics["loss"] = loss
            return metrics

        return train_step

    def build_eval_step(self, model, loss_fn, *, jit_compile=False):
        """(inputs, labels) -> mean loss over the global batch, no dropout."""
        forward = tf.function(
            lambda inputs, labels: tf.cast(loss_fn(labels, model(inputs, training=False)), tf.float32),
            jit_compile=jit_compile, autograph=False)

        @tf.function(autograph=False)
        def eval_step(inputs, labels):
            return self.allreduce_mean(forward(inputs, labels))

        return eval_step

    def broadcast_initial_state(self, model, optimizer):
        """Single device: nothing to broadcast."""

    def broadcast_restored_state(self, model, optimizer):
        """After a rollback (lm.training.divergence), in which only the ranks that write checkpoints restored
        one (the others' hosts may not hold it mid-run): every rank's state made the writers'."""
        self.broadcast_initial_state(model, optimizer)

    def checkpoints(self, directory):
        """This strategy's checkpoints in `directory` (see `Checkpoints`)."""
        return Checkpoints(self, directory)

    def choose_checkpoint(self, newest_step):
        """The checkpoint step every rank resumes from: rank 0's `newest_step` (None: start afresh)."""
        if self.size == 1:
            return newest_step
        return self.broadcast_step(newest_step if self.is_chief else None)

    def broadcast_step(self, step):
        """Rank 0's `step` (an int or None) on every rank; adapters with several ranks implement it."""
        raise NotImplementedError("strategy %s: broadcast_step with %d ranks" % (self.name, self.size))

    def whole_model(self, model):
        """Called on every rank before the export: the complete model on the chief (it exports it)."""
        return model

    def barrier(self):
        """Single process: nothing to wait for."""

    def shutdown(self):
        """Nothing to release."""


def encode_step(step):
    """`step` (int or None) as a float a collective carries exactly; None is 0."""
    if step is None:
        return 0.0
    if not 0 <= step <= LARGEST_STEP:
        raise ValueError("checkpoint step %d is outside 0..%d, which the collectives carry exactly" % (step, LARGEST_STEP))
    return float(step + 1)


def decode_step(value):
    value = int(round(float(value)))
    return None if value == 0 else value - 1


class Checkpoints:
    """A strategy's checkpoints in one directory: lm.checkpoint's .npz files (`Checkpointer`),
    written by the ranks with `writes_checkpoints`, one file per step.

    Training calls `save` on every rank; `newest_step`, `has`, `where`, `read_meta` and `restore`
    answer for this rank's directory (on SageMaker, its host's copy of the S3 checkpoints).
    """

    def __init__(self, strategy, directory):
        self.strategy = strategy
        self.files = checkpoint.Checkpointer(directory)

    def kept_steps(self):
        """The steps of the checkpoints here, oldest first."""
        return self.files.steps()

    def newest_step(self):
        steps = self.kept_steps()
        return steps[-1] if steps else None

    def discard_after(self, step):
        """This rank's checkpoints of steps after `step` removed (a rollback discards the diverged ones)."""
        if self.strategy.writes_checkpoints:
            self.files.discard_after(step)

    def has(self, step):
        return step in self.files.steps()

    def where(self, step):
        return self.files.path(step)

    def read_meta(self, step):
        return checkpoint.read_meta(self.files.path(step))

    def restore(self, step, variables):
        checkpoint.restore(self.files.path(step), variables)

    def save(self, step, variables, meta):
        """This rank's part of the checkpoint of `step` (the write may go on in the background)."""
        if self.strategy.writes_checkpoints:
            self.files.save(step, variables, meta)

    def wait(self):
        """Return when this rank's last save is on disk."""
        self.files.wait()
