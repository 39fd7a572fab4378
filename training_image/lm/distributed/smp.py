"""SageMaker model parallel v1 (SMP, TensorFlow; TF 2.6 image): pipeline over `partitions` GPUs.

What the library's documentation asks of a TF script, and where it happens here:
- `smp.init()` in `setup`; `mp_parameters` (SM_HP_MP_PARAMETERS) checked first, so a bad value
  fails with the field's name instead of deep inside the library.
- the model subclasses `smp.DistributedModel`: `build_model` wraps our Keras GPT in one
  (`DistributedGPT`), so SMP partitions the ops of its `call`.
- forward and backward inside an `@smp.step` function that returns gradients and loss; outside
  it, `accumulate()` the gradients and `reduce_mean()` the loss over the microbatches.
- `tf.GradientTape` is not supported inside `smp.step`; the documented alternative
  (`Optimizer.get_gradients`) is `tf.gradients` of the loss, which is what we call.
- with `"horovod": true` the library initializes Horovod itself (never `hvd.init()` here); the
  accumulated gradients are averaged over the data-parallel replicas with `hvd.allreduce`, and
  model and optimizer state is broadcast from rank 0 after the first step.
- data is sharded and seeded by `smp.dp_rank()` (`data_parallel_rank`), batches divide into
  microbatches (`drop_remainder=True`; checked when the step is traced).
- XLA through `tf.config.optimizer.set_jit`: `jit_compile` on `smp.step` interferes with the
  pipeline.
"""
import json
import os

from lm.compat import tf
from lm.distributed.base import Strategy, apply_update
from lm.job import validate_mp_parameters

MP_PARAMETERS_ENV = "SM_HP_MP_PARAMETERS"


def read_mp_parameters(environ=None):
    """The job's `mp_parameters` from the environment, validated (see lm.job.validate_mp_parameters)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(MP_PARAMETERS_ENV)
    if not raw:
        raise ValueError("%s is not set: strategy smp needs mp_parameters (SageMaker sets it from the "
                         "job's distribution.smdistributed.modelparallel.parameters)" % MP_PARAMETERS_ENV)
    try:
        values = json.loads(raw)
    except ValueError as error:
        raise ValueError("%s is not valid JSON (%s): %r" % (MP_PARAMETERS_ENV, error, raw))
    return validate_mp_parameters(values)


def _distributed_gpt(smp, gpt):
    class DistributedGPT(smp.DistributedModel):
        """Our GPT as the one `smp.DistributedModel`; `gpt` stays a plain Keras model."""

        def __init__(self, inner):
            super().__init__(name="distributed_%s" % inner.name)
            self.gpt = inner

        def call(self, inputs, training=None):
            return self.gpt(inputs, training=training)

        def count_params(self):
            # Keras counts only after a first call, and this model may be called only in smp.step.
            return self.gpt.count_params()

    return DistributedGPT(gpt)


class SMPStrategy(Strategy):
    name = "smp"

    def __init__(self):
        super().__init__()
        self._smp = None
        self._hvd = None
        self.mp_parameters = None
        self.mp_rank = 0
        self.mp_size = 1
        self._dp_rank = 0
        self._dp_size = 1

    def setup(self):
        # GPUs are not pinned here: the library places each partition on its device.
        self.mp_parameters = read_mp_parameters()
        import smdistributed.modelparallel.tensorflow as smp

        smp.init()
        self._smp = smp
        self.take_ranks_from(smp)
        self.mp_rank, self.mp_size = smp.mp_rank(), smp.mp_size()
        self._dp_rank, self._dp_size = smp.dp_rank(), smp.dp_size()
        if self.mp_parameters.get("horovod"):
            import horovod.tensorflow as hvd  # initialized by smp.init()

            self._hvd = hvd
        elif self._dp_size > 1:
            raise ValueError("mp_parameters.horovod must be true with %d model replicas (%d processes / %d "
                             "partitions): SMP for TensorFlow averages gradients across replicas with Horovod"
                             % (self._dp_size, self.size, self.mp_size))
        return self

    @property
    def microbatches(self):
        return self.mp_parameters["microbatches"]

    @property
    def data_parallel_rank(self):
        return self._dp_rank

    @property
    def data_parallel_size(self):
        return self._dp_size

    @property
    def writes_checkpoints(self):
        # One writer per pipeline partition: the first replica's rank holding it.
        return self._dp_rank == 0

    @property
    def checkpoint_tag(self):
        return "mp%d" % self.mp_rank

    def build_model(self, build_fn):
        return _distributed_gpt(self._smp, build_fn())

    def allreduce_mean(self, value):
        return self._hvd.allreduce(tf.convert_to_tensor(value)) if self._hvd is not None else value

    def _check_batch(self, inputs):
        batch = inputs.shape[0]
        if batch is None:
            raise ValueError("strategy smp needs a fixed batch size: batch the dataset with drop_remainder=True")
        if batch % self.microbatches:
            raise ValueError("the per-replica batch of %d sequences (global_batch_size / %d model replicas) is not "
                             "divisible by mp_parameters.microbatches=%d" % (batch, self._dp_size, self.microbatches))

    def build_train_step(self, model, optimizer, loss_fn, *, grad_clip=0.0, loss_scale=None, jit_compile=False):
        # Set both ways: lm.train rebuilds the steps without XLA when XLA fails to compile.
        tf.config.optimizer.set_jit(bool(jit_compile))
        variables = model.trainable_variables

        @self._smp.step
        def forward_backward(inputs, labels):
            loss = tf.cast(loss_fn(labels, model(inputs, training=True)), tf.float32)
            scaled = loss_scale.scale(loss) if loss_scale is not None else loss
            # Dense gradients: StepOutput is documented for tensors, not IndexedSlices.
            return [tf.convert_to_tensor(grad) for grad in tf.gradients(scaled, variables)], loss

        @tf.function
        def train_step(inputs, labels):
            self._check_batch(inputs)
            grads, loss = forward_backward(inputs, labels)
            grads = [grad.accumulate() for grad in grads]
            if self._hvd is not None:
                grads = [self._hvd.allreduce(grad) for grad in grads]
            if loss_scale is not None:
                grads = loss_scale.unscale(grads)
            metrics = apply_update(optimizer, variables, grads, grad_clip, loss_scale)
            metrics["loss"] = self.allreduce_mean(loss.reduce_mean())
            return metrics

        return train_step

    def build_eval_step(self, model, loss_fn, *, jit_compile=False):
        @self._smp.step
        def forward(inputs, labels):
            return tf.cast(loss_fn(labels, model(inputs, training=False)), tf.float32)

        @tf.function
        def eval_step(inputs, labels):
            self._check_batch(inputs)
            return self.allreduce_mean(forward(inputs, labels).reduce_mean())

        return eval_step

    def broadcast_initial_state(self, model, optimizer):
        if self._hvd is not None:
            self._hvd.broadcast_variables(model.variables, root_rank=0)
            self._hvd.broadcast_variables(optimizer.variables, root_rank=0)

    def barrier(self):
        self._smp.barrier()
