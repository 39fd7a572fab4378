"""SageMaker model parallel v1 (SMP, TensorFlow; TF 2.6 image): pipeline over `partitions` GPUs.

What the library's documentation asks of a TF script, and what its own code (a public copy of
the 1.12.1 wheel's Python source, GitHub tkazusa/smdistributed_modelparallel; the TF 2.6 DLC
ships 1.4.0) does beyond it, and where it happens here:
- `smp.init()` in `setup`; `mp_parameters` (SM_HP_MP_PARAMETERS) checked first, so a bad value
  fails with the field's name instead of deep inside the library. With more than one partition
  they must say `auto_partition: false, default_partition: 0` (`placement_problem`): the library
  ignores `smp.partition` otherwise, and controlplane.planner counts the placement made with it.
- the model class itself subclasses `smp.DistributedModel` (`distributed_gpt_class`: GPT and
  DistributedModel) and creates its layers in `__init__` from plain arguments, because the
  library builds a tracing copy by calling the class again with them. Each block runs in
  `smp.partition(i * partitions // n_layer)`, the embeddings, the output layer and the loss in
  partition 0 (which holds the tied token table). The model is partitioned in the first
  `smp.step` call, so `build_model` runs one forward step on a tiny batch first: each rank then
  holds only its partition's variables (it builds only its layers), and the optimizer's slots
  are created for those only. Nothing here reads another partition's variables or asks Keras
  for the whole model (`count_params()` fails on a rank).
- the loss is computed inside `call`: "tensors returned from the call method will be broadcast
  across model-parallel devices", so the model returns the scalar loss, not the logits.
- forward and backward inside an `@smp.step` function that returns gradients and loss, called
  inside a `tf.function` where `accumulate()` adds the microbatches' gradients into accumulators
  one microbatch at a time (called eagerly, all M microbatches' gradients are alive at once);
  `reduce_mean()` the loss. `tf.GradientTape` is not supported inside `smp.step`; the documented
  alternative (`Optimizer.get_gradients`) is `tf.gradients` of the loss, which is what we call.
  `tf.recompute_grad` cannot be used: the ranks that import rank 0's graph lack its gradient
  (lm.training.train refuses `recompute` with smp).
- clipping and the fp16 overflow skip need the norm of the whole model's gradients: each rank
  holds its partition's, so the squared norms are summed over the model-parallel group
  (`smp.allgather(..., smp.CommGroup.MP_GROUP)`, eagerly between the step and the update); an
  inf/nan anywhere makes the sum non-finite on every partition, so all skip the same steps.
- with `"horovod": true` the library initializes Horovod itself (never `hvd.init()` here); the
  accumulated gradients are averaged over the data-parallel replicas with `hvd.allreduce`, and
  model and optimizer state is broadcast from rank 0 after the first step.
- votes and agreed values (stop after SIGTERM, time-based checkpoints) span every rank
  (`smp.CommGroup.WORLD`): a pipeline partner that missed the vote would wait forever.
- checkpoints go through `smp.CheckpointManager(checkpoint, directory, max_to_keep,
  checkpoint_name)` ("TensorFlow API"), whose `save()` writes a new checkpoint into its directory
  and whose `restore()` "restores the latest checkpoint in the specified directory" (the 1.12.1
  source: it reads every partition's subdirectory and only warns when a file is missing). Every
  save gets a directory of its own, `<checkpoint dir>/smp-<step, 8 digits>/` (`SMPCheckpoints`):
  the ranks of the first model replica (`dp_rank() == 0`; the others hold the same values) each
  save their partition's state through a manager of that directory and report the files that
  save wrote (names and sizes); after an allgather over every rank, rank 0 writes `complete.json`
  there (our metadata: step, hyperparameters, dataset fingerprint, and the manifest of every
  partition's files; written last) and removes all but the newest two marked step directories.
  A save is complete where its marker and every file of its manifest, at its size, are present.
  At a start rank 0 chooses the newest complete step directory on its disk (a marked one with a
  file missing gives way to the previous one) and sends the step to every rank (`smp.broadcast`
  / `smp.recv_from` over WORLD); every rank checks that it sees the same save complete, builds a
  manager on it and calls `restore()` after the partition step. Each rank's state is saved under
  a key naming its partition (`tf.train.Checkpoint(partition_<k>=[variables])`), so a restore
  that also reads other partitions' files cannot assign them to this partition's variables.
- the export gathers every partition's weights on the chief by layer path (`weight_paths`) into one
  plain model, which `lm.serving.export` writes as for any strategy: a weight per message
  (`smp.send` to the chief), cut in pieces of at most the library's own checkpoint transfer chunk
  (`transfer_chunk_bytes`: 1 GiB unless SMP_CKPT_TRANSFER_CHUNK_SIZE says otherwise).
- data is sharded and seeded by `smp.dp_rank()` (`data_parallel_rank`), batches divide into
  microbatches (`drop_remainder=True`; checked before each step).
- XLA through `tf.config.optimizer.set_jit`: `jit_compile` on `smp.step` interferes with the
  pipeline.
"""
import functools
import json
import os
import re
import shutil

import numpy as np

from lm.compat import tf
from lm.spec import shards
from lm.distributed.base import Strategy, apply_update
from lm.spec.job import validate_mp_parameters

MP_PARAMETERS_ENV = "SM_HP_MP_PARAMETERS"
STEP_DIRECTORY = re.compile(r"^smp-(\d{8})$")
COMPLETE = "complete.json"
MANIFEST = "smp_files"  # in complete.json: {file relative to the step directory: bytes}


def horovod_problem(mp_parameters, replicas, processes):
    """Why SMP refuses validated `mp_parameters` for `replicas` model replicas of `processes`, or None."""
    if replicas > 1 and not mp_parameters.get("horovod"):
        return ("mp_parameters.horovod must be true with %d model replicas (%d processes / %d partitions): SMP "
                "for TensorFlow averages gradients across replicas with Horovod"
                % (replicas, processes, mp_parameters["partitions"]))
    return None


def placement_problem(mp_parameters):
    """Why SMP would not place the model as controlplane.planner counts it, or None.

    `smp.partition` is ignored unless `auto_partition` is false (the library's `partition` in
    smdistributed/modelparallel/tensorflow/utils.py, lines 772-790, and the TensorFlow API page);
    otherwise the library splits the graph of the first traced step itself (auto.py, lines
    178-230). controlplane.planner counts partition 0 holding the embeddings, the output layer, the loss and
    ceil(n_layer / partitions) blocks: what DistributedGPT's `smp.partition` contexts place, and
    what is outside them goes to `default_partition`."""
    if mp_parameters["partitions"] == 1:
        return None
    if mp_parameters.get("auto_partition", True) is not False or mp_parameters.get("default_partition") != 0:
        return ("mp_parameters.auto_partition must be false and mp_parameters.default_partition 0 with %d partitions "
                "(got auto_partition=%s, default_partition=%s): lm places the embeddings, the output layer and the loss "
                "in partition 0 and the blocks in equal contiguous shares, as controlplane.planner counts them, with smp.partition, "
                "which the library ignores under auto-partitioning"
                % (mp_parameters["partitions"], json.dumps(mp_parameters.get("auto_partition", True)),
                   json.dumps(mp_parameters.get("default_partition"))))
    return None


def microbatch_problem(mp_parameters, replica_batch, replicas):
    """Why SMP cannot split one replica's batch of `replica_batch` sequences into its microbatches, or None."""
    if replica_batch % mp_parameters["microbatches"]:
        return ("the per-replica batch of %d sequences (global_batch_size / %d model replicas) is not divisible by "
                "mp_parameters.microbatches=%d" % (replica_batch, replicas, mp_parameters["microbatches"]))
    return None


def read_mp_parameters(environ=None):
    """The job's `mp_parameters` from the environment, validated (see lm.spec.job.validate_mp_parameters)."""
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
    """The pipeline partition of block `index`: contiguous, equal shares (controlplane.planner counts the same)."""
    return index * partitions // n_layer


def sequence_loss(labels, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=tf.cast(logits, tf.float32)))


def distributed_gpt_class(smp, model_class):
    """`model_class` (our GPT, or the model of a family derived from it that declares smp) as the one
    `smp.DistributedModel` of the job, the way the library requires it.

    `DistributedModel.__init__` makes a CPU tracing copy by calling the model's class again with
    the arguments its `__init__` was given (smdistributed/modelparallel/tensorflow/v2/model.py,
    `_duplicate_model` and `_get_init_args`, lines 62-126 in 1.12.1), and its first call refuses
    layers with their own `build()` that the two share (`_raise_if_layers_not_duplicated`, lines
    249-257). So the class itself subclasses `smp.DistributedModel` and GPT.__init__ creates every
    layer from plain arguments (a config dict, `recompute`, the name); a wrapper around a GPT built
    outside would share every layer with its copy. The library partitions the graph it traces
    from that copy (lines 259-277), so what `call` uses must be the class's: the loss function is
    set on the class, not on the instance.

    The library's `DistributedModel` derives from TensorFlow's bundled Keras
    (`tensorflow.python.keras.models.Model`, v2/model.py line 14), which on TF 2.6 is not `tf.keras`
    (the keras 2.6 package): the GPT and every layer come from the Keras `keras_of` finds it derives
    from. Its MRO is then DistributedGPT, GPT, DistributedModel, Model: GPT.__init__ calls
    DistributedModel.__init__ directly, whose caller frame the library reads the arguments from, and
    calls go through DistributedModel.__call__, where the library partitions.
    """
    from lm.compat import keras_of
    from lm.models.gpt import gpt_classes

    # The same code (model_class.code: its class without a Keras) made on the library's Keras.
    class DistributedGPT(gpt_classes(keras_of(smp.DistributedModel), model_class.code).GPT, smp.DistributedModel):
        """The GPT whose call takes (tokens, labels) and returns the mean token loss: "tensors
        returned from the call method will be broadcast across model-parallel devices"."""

        loss_fn = staticmethod(sequence_loss)

        def place(self, block):
            index = 0 if block is None else partition_of_block(block, self.model_config.n_layer, smp.mp_size())
            return smp.partition(index)

        def call(self, inputs, labels, training=None):
            logits = super().call(inputs, training=training)
            with smp.partition(0):
                return tf.cast(self.loss_fn(labels, logits), tf.float32)

    return DistributedGPT


# The library moves its own checkpoint files between ranks in pieces of at most this many bytes
# (smdistributed/modelparallel/tensorflow/utils.py of 1.12.1, get_transfer_chunk_size, lines 564-567:
# SMP_CKPT_TRANSFER_CHUNK_SIZE, else 1 GiB, "as ctypes string_buffer adds this limitation"; break_data,
# lines 570-585); the export's pieces are no larger. A message's size also travels as a C int
# (backend/collectives.py, lines 237-247, 254-263, 334-348): 2 GiB, well above a chunk and its framing.
TRANSFER_CHUNK_ENV = "SMP_CKPT_TRANSFER_CHUNK_SIZE"
DEFAULT_TRANSFER_CHUNK_BYTES = 1024 ** 3


def transfer_chunk_bytes():
    return int(os.environ.get(TRANSFER_CHUNK_ENV) or DEFAULT_TRANSFER_CHUNK_BYTES)


def count_pieces(nbytes):
    """How many messages `message_pieces` cuts `nbytes` bytes into (one for none)."""
    return max(1, -(-nbytes // transfer_chunk_bytes()))


def message_pieces(data):
    """`data` (bytes) in consecutive pieces of at most the library's transfer chunk."""
    size = transfer_chunk_bytes()
    return [data[start:start + size] for start in range(0, max(len(data), 1), size)]


def weight_paths(model):
    """{path: weight} of the weights this rank holds, named by layer, not by TensorFlow's variable
    name: "block_3/mlp/fc_kernel". A rank builds only the layers placed on it, under name scopes of
    the library's import (v2/serialization.py, `import_graph`, lines 280-313), so neither the
    variable names nor the positions in `model.weights` match a plain model's; the layer names do."""
    held = {id(weight) for weight in model.weights}
    paths = {}
    for layer in model.layers:
        for weight in layer.weights:
            if id(weight) in held:
                inner = weight.name.split(":")[0].rsplit(layer.name + "/", 1)[-1]
                paths["%s/%s" % (layer.name, inner)] = weight
    return paths


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
        problem = placement_problem(self.mp_parameters)
        if problem:
            raise ValueError(problem)
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
        model = build_fn(build=False, distribute=functools.partial(distributed_gpt_class, self._smp))

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
        """Mean over every rank (eager: lm.training.train's votes and agreed clocks)."""
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

    def _use_loss(self, model, loss_fn):
        # On the class: the library traces the call of its tracing copy (see distributed_gpt_class).
        type(model).loss_fn = staticmethod(loss_fn)

    def build_train_step(self, model, optimizer, loss_fn, *, grad_clip=0.0, loss_scale=None, jit_compile=False):
        # Set both ways: lm.training.train rebuilds the steps without XLA when XLA fails to compile.
        tf.config.optimizer.set_jit(bool(jit_compile))
        self._use_loss(model, loss_fn)
        variables = model.trainable_variables  # this rank's partition

        @self._smp.step
        def forward_backward(inputs, labels):
            loss = model(inputs, labels, training=True)
            scaled = loss_scale.scale(loss) if loss_scale is not None else loss
            # Dense gradients: StepOutput is documented for tensors, not IndexedSlices.
            return [tf.convert_to_tensor(grad) for grad in tf.gradients(scaled, variables)], loss

        # smp.step inside a tf.function, as the library documents it: there `accumulate()` (its
        # default method, "variable") adds each microbatch's gradients into one accumulation
        # variable per gradient as they come (smdistributed/modelparallel/tensorflow/split.py,
        # `_smp_accum`, lines 216-265), so one microbatch's gradients and the accumulators are
        # alive, not all M microbatches' (called eagerly, accumulate() keeps every output and
        # averages them at the end, line 217-218; add_n waits for all M inputs in a graph too).
        @tf.function
        def accumulated_gradients(inputs, labels):
            grads, loss = forward_backward(inputs, labels)
            grads = [self._dp_mean(grad.accumulate()) for grad in grads]
            if loss_scale is not None:
                grads = loss_scale.unscale(grads)
            squared = tf.add_n([tf.reduce_sum(tf.square(grad)) for grad in grads]) if grads else tf.constant(0.0)
            return grads, squared, self._dp_mean(loss.reduce_mean())

        @tf.function
        def update(grads, grad_norm, loss):
            return apply_update(optimizer, variables, grads, grad_clip, loss_scale, grad_norm=grad_norm, loss=loss)

        # The model-parallel norm is a Python-level allgather, between the two graphs.
        def train_step(inputs, labels):
            self._check_batch(inputs)
            grads, squared, loss = accumulated_gradients(inputs, labels)
            metrics = update(grads, self.model_parallel_norm(squared), loss)
            metrics["loss"] = loss
            return metrics

        return train_step

    def build_eval_step(self, model, loss_fn, *, jit_compile=False):
        self._use_loss(model, loss_fn)

        @self._smp.step
        def forward(inputs, labels):
            return model(inputs, labels, training=False)

        @tf.function
        def mean_loss(inputs, labels):
            return self._dp_mean(forward(inputs, labels).reduce_mean())

        def eval_step(inputs, labels):
            self._check_batch(inputs)
            return mean_loss(inputs, labels)

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
        """Every partition's weights in one plain GPT on the chief's CPU; None on other ranks.

        Each rank holds only its partition's layers, so the weights travel by layer path
        (`weight_paths`): the partitions of the first replica tell each other what they hold (one small
        `smp.allgather` over the model-parallel group), then each weight goes to the chief by itself
        (`smp.send` / `smp.recv_from`, in the order of the paths), cut into pieces of the library's
        transfer chunk (`message_pieces`): a partition of gpt-1.3b is about 2.6 GB of fp32."""
        from lm import models
        smp = self._smp
        if self._dp_rank != 0:
            return None  # the first replica's partitions hold the same weights
        held = weight_paths(model)
        inventory = {path: (tuple(weight.shape), weight.dtype.name) for path, weight in held.items()}
        owners = {path: (mp_rank, shape, dtype)
                  for mp_rank, part in enumerate(smp.allgather(inventory, smp.CommGroup.MP_GROUP))
                  for path, (shape, dtype) in part.items()}
        if not self.is_chief:
            for path in sorted(owners):
                if owners[path][0] == self.mp_rank:
                    for piece in message_pieces(held[path].numpy().tobytes()):
                        smp.send(piece, 0, smp.RankType.MP_RANK)
            return None
        gathered = {}  # every message is received before anything is checked: a sender waits for it
        for path in sorted(owners):
            owner, shape, dtype = owners[path]
            if owner == self.mp_rank:
                gathered[path] = held[path].numpy()
                continue
            dtype = tf.as_dtype(dtype)
            pieces = [smp.recv_from(owner, smp.RankType.MP_RANK)
                      for _ in range(count_pieces(int(np.prod(shape, dtype=np.int64)) * dtype.size))]
            gathered[path] = np.frombuffer(b"".join(pieces), dtype.as_numpy_dtype).reshape(shape)
        with tf.device("/CPU:0"):
            whole = models.build(model.model_config)
        wanted = weight_paths(whole)
        missing = sorted(set(wanted) - set(gathered))
        if missing:
            raise RuntimeError("smp: no partition holds the weights %s of the model" % ", ".join(missing[:5]))
        for path, weight in wanted.items():
            if tuple(weight.shape) != gathered[path].shape:
                raise RuntimeError("smp: partition weight %s has shape %s, the model's is %s"
                                   % (path, gathered[path].shape, tuple(weight.shape)))
            weight.assign(gathered[path])
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

    def _marked_steps(self):
        return [step for step in self._steps() if os.path.isfile(self._marker(step))]

    def complete_steps(self):
        return [step for step in self._marked_steps() if not self.missing_files(step)]

    def kept_steps(self):
        """The steps of the marked saves here (rank 0's, which writes the markers), oldest first."""
        return self._marked_steps()

    def discard_after(self, step):
        """The saves of steps after `step` removed by the ranks that write (a rollback discards the diverged
        ones): each host's copy of them; the marker goes with its directory."""
        if self.strategy.writes_checkpoints or self.strategy.is_chief:
            for newer in self._steps():
                if newer > step:
                    shutil.rmtree(self.where(newer), ignore_errors=True)

    def newest_step(self):
        """The newest save complete here: a marked save with a partition's file missing (S3 brought it
        back only in part) gives way to the previous complete one."""
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def has(self, step):
        """Whether the save of `step` is complete here: its marker, and every file its manifest lists
        with the size it was written with (S3 brings a save back file by file; the library's
        `restore()` only warns "No checkpoints restored." for a partition whose files are missing,
        smdistributed/modelparallel/tensorflow/v2/checkpoint.py, lines 73-77)."""
        return os.path.isfile(self._marker(step)) and not self.missing_files(step)

    def missing_files(self, step):
        """The files of the manifest of `step` that are absent or of another size here."""
        files = self.read_meta(step).get(MANIFEST)
        if not isinstance(files, dict) or not files:
            return ["%s (no manifest of files)" % self._marker(step)]
        root = self.where(step)
        return sorted(name for name, size in files.items()
                      if not os.path.isfile(os.path.join(root, name)) or os.path.getsize(os.path.join(root, name)) != size)

    def read_meta(self, step):
        with open(self._marker(step)) as handle:
            return json.load(handle)

    def _manager(self, step, variables):
        state = tf.train.Checkpoint(**{"partition_%d" % self.strategy.mp_rank: list(variables)})
        return self.strategy._smp.CheckpointManager(state, directory=self.where(step), max_to_keep=1)

    def restore(self, step, variables):
        self._manager(step, variables).restore()

    def _written(self, saved_path, step):
        """{path relative to the step directory: bytes} of the files in the directory of one save: the
        manager's own (`<step directory>/mp_rank_<k>/` in the library, v2/checkpoint.py line 19)."""
        root = self.where(step)
        written = {}
        for directory, _, names in os.walk(os.path.dirname(saved_path)):
            for name in names:
                path = os.path.join(directory, name)
                written[os.path.relpath(path, root)] = os.path.getsize(path)
        return written

    def save(self, step, variables, meta):
        """Every partition's state at `step`, then (rank 0, once every rank has saved) the marker with
        the manifest of every partition's files, written last."""
        strategy = self.strategy
        written = {}
        if strategy.writes_checkpoints:
            written = self._written(self._manager(step, variables).save(), step)
        # Over every rank: it returns when all have saved, and brings rank 0 the files of partitions
        # whose ranks write on other hosts.
        manifest = {}
        for part in strategy._smp.allgather(written, strategy._smp.CommGroup.WORLD):
            manifest.update(part)
        if not strategy.is_chief:
            return
        os.makedirs(self.where(step), exist_ok=True)
        shards.write_atomically(self._marker(step), json.dumps(dict(meta, step=step, **{MANIFEST: manifest}),
                                                               sort_keys=True))
        # Marked, not verified: during the run the partitions of other hosts are on their disks only.
        kept = self._marked_steps()[-self.keep:]
        for old in self._steps():
            if old < kept[0]:
                shutil.rmtree(self.where(old), ignore_errors=True)

    def wait(self):
        """Saves are synchronous: nothing pending."""
