"""SageMaker model parallel v1 (SMP, TensorFlow; TF 2.6 image): pipeline over `partitions` GPUs.

What the library's documentation asks of a TF script, and where it happens here (SageMaker
Python SDK docs, "TensorFlow API" and "Common API" of smp_versions/latest, and the developer
guide's "Modify a TensorFlow Training Script"):
- `smp.init()` in `setup`; `mp_parameters` (SM_HP_MP_PARAMETERS) checked first, so a bad value
  fails with the field's name instead of deep inside the library.
- the model subclasses `smp.DistributedModel` (`DistributedGPT`); "any operation that is part of
  `call()` executes in exactly one of the devices". Our GPT is built without weights
  (`build=False`) and each block runs in `smp.partition(i * partitions // n_layer)`, the
  embeddings, the output layer and the loss in partition 0 (which holds the tied token table),
  so with `auto_partition: false` block i's variables are created on that partition's rank
  only, and with auto-partitioning the library places them. The model is partitioned in the
  first `smp.step` call, so `build_model` runs one forward step on a tiny batch first: the
  optimizer's slots are then created for this rank's variables only.
- the loss is computed inside `call`: "tensors returned from the call method will be broadcast
  across model-parallel devices", so the model returns the scalar loss, not the logits.
- forward and backward inside an `@smp.step` function that returns gradients and loss; outside
  it, `accumulate()` the gradients and `reduce_mean()` the loss over the microbatches.
  `tf.GradientTape` is not supported inside `smp.step`; the documented alternative
  (`Optimizer.get_gradients`) is `tf.gradients` of the loss, which is what we call.
- clipping and the fp16 overflow skip need the norm of the whole model's gradients: each rank
  holds its partition's, so the squared norms are summed over the model-parallel group
  (`smp.allgather(..., smp.CommGroup.MP_GROUP)`); an inf/nan anywhere makes the sum non-finite
  on every partition, so all skip the same steps.
- with `"horovod": true` the library initializes Horovod itself (never `hvd.init()` here); the
  accumulated gradients are averaged over the data-parallel replicas with `hvd.allreduce`, and
  model and optimizer state is broadcast from rank 0 after the first step.
- votes and agreed values (stop after SIGTERM, time-based checkpoints) span every rank
  (`smp.CommGroup.WORLD`): a pipeline partner that missed the vote would wait forever.
- checkpoints go through `smp.CheckpointManager(checkpoint, directory, max_to_keep,
  checkpoint_name)` ("TensorFlow API"), whose `save()` writes a new checkpoint into its directory
  and whose `restore()` "restores the latest checkpoint in the specified directory"; the files it
  writes there are the library's own (undocumented), so nothing here reads them. To restore a
  chosen step with those two calls only, every save gets a directory of its own,
  `<checkpoint dir>/smp-<step, 8 digits>/` (`SMPCheckpoints`): the ranks of the first model
  replica (`dp_rank() == 0`; the others hold the same values) each save their partition's state
  through a manager of that directory; after a barrier over every rank, rank 0 writes
  `complete.json` there (our metadata: step, hyperparameters, dataset fingerprint; written last,
  so a directory without it is a save that did not finish) and removes all but the newest two
  complete step directories. At a start rank 0 chooses the newest complete step directory on its
  disk and sends the step to every rank (`smp.broadcast` / `smp.recv_from` over WORLD); every rank
  checks that it sees the same directory complete, builds a manager on it and calls `restore()`
  after the partition step ("restore ... after the first step": `build_model` runs that step).
  Each rank's state is saved under a key naming its partition (`tf.train.Checkpoint(partition_<k>
  =[variables])`), so a restore that also reads other partitions' files cannot assign them to this
  partition's variables.
- the export gathers every partition's weights on the chief (`smp.allgather` over the
  model-parallel group) into one plain model, which `lm.export` writes as for any strategy.
- data is sharded and seeded by `smp.dp_rank()` (`data_parallel_rank`), batches divide into
  microbatches (`drop_remainder=True`; checked before each step).
- XLA through `tf.config.optimizer.set_jit`: `jit_compile` on `smp.step` interferes with the
  pipeline.
"""
import json
import os
import re
import shutil

from lm.compat import tf
from lm import shards
from lm.distributed.base import Strategy, apply_update
from lm.job import validate_mp_parameters

MP_PARAMETERS_ENV = "SM_HP_MP_PARAMETERS"
STEP_DIRECTORY = re.compile(r"^smp-(\d{8})$")
COMPLETE = "complete.json"


def horovod_problem(mp_parameters, replicas, processes):
    """Why SMP refuses validated `mp_parameters` for `replicas` model replicas of `processes`, or None."""
    if replicas > 1 and not mp_parameters.get("horovod"):
        return ("mp_parameters.horovod must be true with %d model replicas (%d processes / %d partitions): SMP "
                "for TensorFlow averages gradients across replicas with Horovod"
                % (replicas, processes, mp_parameters["partitions"]))
    return None


def microbatch_problem(mp_parameters, replica_batch, replicas):
    """Why SMP cannot split one replica's batch of `replica_batch` sequences into its microbatches, or None."""
    if replica_batch % mp_parameters["microbatches"]:
        return ("the per-replica batch of %d sequences (global_batch_size / %d model replicas) is not divisible by "
                "mp_parameters.microbatches=%d" % (replica_batch, replicas, mp_parameters["microbatches"]))
    return None


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


def partition_of_block(index, n_layer, partitions):
    """The pipeline partition of block `index`: contiguous, equal shares (lm.plan counts the same)."""
    return index * partitions // n_layer


def sequence_loss(labels, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=tf.cast(logits, tf.float32)))


def _distributed_gpt(smp, gpt):
    from lm.model import GPT
    if not isinstance(gpt, GPT):
        raise ValueError("strategy smp partitions the gpt model family only, got %s" % type(gpt).__name__)
    n_layer, partitions = gpt.model_config.n_layer, smp.mp_size()
    gpt.place = lambda block: smp.partition(0 if block is None else partition_of_block(block, n_layer, partitions))

    class DistributedGPT(smp.DistributedModel):
        """Our GPT as the one `smp.DistributedModel`; returns the mean token loss."""

        loss_fn = staticmethod(sequence_loss)

        def __init__(self, inner):
            super().__init__(name="distributed_%s" % inner.name)
            self.gpt = inner

        def call(self, inputs, labels, training=None):
            logits = self.gpt(inputs, training=training)
            with smp.partition(0):
                return tf.cast(self.loss_fn(labels, logits), tf.float32)

        def count_params(self):
            # Every partition's parameters (Keras would count this rank's only).
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
        problem = horovod_problem(self.mp_parameters, self._dp_size, self.size)
        if problem:
            raise ValueError(problem)
        if self.mp_parameters.get("horovod"):
            import horovod.tensorflow as hvd  # initialized by smp.init()

            self._hvd = hvd
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

    def build_model(self, build_fn):
        """The DistributedGPT, partitioned: each rank holds (and later trains) only its variables."""
        model = _distributed_gpt(self._smp, build_fn(build=False))

        @self._smp.step
        def partition_step(inputs, labels):
            return model(inputs, labels, training=False)

        tokens = tf.zeros([self.microbatches, 1], tf.int32)
        partition_step(tokens, tokens)
        return model

    def _dp_mean(self, value):
        """Mean over the model replicas (the partitions of one replica agree already)."""
        return self._hvd.allreduce(value) if self._hvd is not None else value

    def allreduce_mean(self, value):
        """Mean over every rank (eager: lm.train's votes and agreed clocks)."""
        values = self._smp.allgather(float(value), self._smp.CommGroup.WORLD)
        return sum(values) / len(values)

    def _check_batch(self, inputs):
        batch = inputs.shape[0]
        if batch is None:
            raise ValueError("strategy smp needs a fixed batch size: batch the dataset with drop_remainder=True")
        problem = microbatch_problem(self.mp_parameters, batch, self._dp_size)
        if problem:
            raise ValueError(problem)

    def model_parallel_norm(self, squared_norm):
        """sqrt of the sum of the partitions' squared gradient norms (inf/nan if any is)."""
        squares = self._smp.allgather(float(squared_norm), self._smp.CommGroup.MP_GROUP)
        return tf.sqrt(tf.constant(sum(squares), tf.float32))

    def build_train_step(self, model, optimizer, loss_fn, *, grad_clip=0.0, loss_scale=None, jit_compile=False):
        # Set both ways: lm.train rebuilds the steps without XLA when XLA fails to compile.
        tf.config.optimizer.set_jit(bool(jit_compile))
        model.loss_fn = loss_fn
        variables = model.trainable_variables  # this rank's partition

        @self._smp.step
        def forward_backward(inputs, labels):
            loss = model(inputs, labels, training=True)
            scaled = loss_scale.scale(loss) if loss_scale is not None else loss
            # Dense gradients: StepOutput is documented for tensors, not IndexedSlices.
            return [tf.convert_to_tensor(grad) for grad in tf.gradients(scaled, variables)], loss

        @tf.function
        def average(grads, loss):
            grads = [self._dp_mean(grad) for grad in grads]
            if loss_scale is not None:
                grads = loss_scale.unscale(grads)
            squared = tf.add_n([tf.reduce_sum(tf.square(grad)) for grad in grads]) if grads else tf.constant(0.0)
            return grads, squared, self._dp_mean(loss)

        @tf.function
        def update(grads, grad_norm):
            return apply_update(optimizer, variables, grads, grad_clip, loss_scale, grad_norm=grad_norm)

        # Called eagerly (the model-parallel norm is a Python-level allgather between the two
        # graphs); "add_n" accumulates without the internal variable "variable" would create.
        def train_step(inputs, labels):
            self._check_batch(inputs)
            grads, loss = forward_backward(inputs, labels)
            grads, squared, loss = average([grad.accumulate("add_n") for grad in grads], loss.reduce_mean())
            metrics = update(grads, self.model_parallel_norm(squared))
            metrics["loss"] = loss
            return metrics

        return train_step

    def build_eval_step(self, model, loss_fn, *, jit_compile=False):
        model.loss_fn = loss_fn

        @self._smp.step
        def forward(inputs, labels):
            return model(inputs, labels, training=False)

        def eval_step(inputs, labels):
            self._check_batch(inputs)
            return self._dp_mean(forward(inputs, labels).reduce_mean())

        return eval_step

    def broadcast_initial_state(self, model, optimizer):
        if self._hvd is not None:
            self._hvd.broadcast_variables(model.variables, root_rank=0)
            self._hvd.broadcast_variables(optimizer.variables, root_rank=0)

    def checkpoints(self, directory):
        return SMPCheckpoints(self, directory)

    def broadcast_step(self, step):
        smp = self._smp
        if self.is_chief:
            smp.broadcast(step, smp.CommGroup.WORLD)
            return step
        return smp.recv_from(0, smp.RankType.WORLD_RANK)

    def whole_model(self, model):
        """Every partition's weights in one plain GPT on the chief's CPU; None on other ranks."""
        import numpy as np

        from lm import models
        smp = self._smp
        owned = {id(weight) for weight in model.weights}
        everything = model.gpt.weights
        local = {index: np.asarray(weight.numpy()) for index, weight in enumerate(everything)
                 if id(weight) in owned}
        if self._dp_rank != 0:
            return None  # the first replica's partitions hold the same weights
        parts = smp.allgather(local, smp.CommGroup.MP_GROUP)
        if not self.is_chief:
            return None
        gathered = {}
        for part in parts:
            gathered.update(part)
        missing = sorted(set(range(len(everything))) - set(gathered))
        if missing:
            raise RuntimeError("smp: no partition holds weights %s of the model" % missing)
        with tf.device("/CPU:0"):
            whole = models.build(model.gpt.model_config)
        whole.set_weights([gathered[index] for index in range(len(everything))])
        return whole

    def barrier(self):
        self._smp.barrier()


class SMPCheckpoints:
    """SMP checkpoints through `smp.CheckpointManager`, one directory per step (see the module doc)."""

    def __init__(self, strategy, directory, keep=2):
        self.strategy, self.directory, self.keep = strategy, directory, keep

    def where(self, step):
        return os.path.join(self.directory, "smp-%08d" % step)

    def _marker(self, step):
        return os.path.join(self.where(step), COMPLETE)

    def _steps(self):
        if not os.path.isdir(self.directory):
            return []
        matches = [STEP_DIRECTORY.match(name) for name in os.listdir(self.directory)]
        return sorted(int(match.group(1)) for match in matches if match)

    def complete_steps(self):
        return [step for step in self._steps() if self.has(step)]

    def newest_step(self):
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def has(self, step):
        return os.path.isfile(self._marker(step))

    def read_meta(self, step):
        with open(self._marker(step)) as handle:
            return json.load(handle)

    def _manager(self, step, variables):
        state = tf.train.Checkpoint(**{"partition_%d" % self.strategy.mp_rank: list(variables)})
        return self.strategy._smp.CheckpointManager(state, directory=self.where(step), max_to_keep=1)

    def restore(self, step, variables):
        self._manager(step, variables).restore()

    def save(self, step, variables, meta):
        """Every partition's state at `step`, then (rank 0, after a barrier over every rank) the marker."""
        strategy = self.strategy
        if strategy.writes_checkpoints:
            self._manager(step, variables).save()
        strategy._smp.barrier()
        if not strategy.is_chief:
            return
        os.makedirs(self.where(step), exist_ok=True)
        shards.write_atomically(self._marker(step), json.dumps(dict(meta, step=step), sort_keys=True))
        kept = self.complete_steps()[-self.keep:]
        for old in self._steps():
            if old < kept[0]:
                shutil.rmtree(self.where(old), ignore_errors=True)

    def wait(self):
        """Saves are synchronous: nothing pending."""
