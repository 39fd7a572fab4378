"""Training checkpoints, and what makes a resume exact.

    <dir>/ckpt-<step, 8 digits><tag>.npz

Every state variable as a NumPy array, plus a little metadata. Written under a temporary
name and renamed, so a file with the final name is always complete and the newest one is
safe to resume from. The variables are saved in a fixed order (model weights, optimizer
state, loss scale) with their shapes, and checked on load. NumPy files read the same on every
TF version we run, unlike Keras' checkpoint layouts.

A save copies nothing on the training thread: its snapshot is the tensors one tf.function
reads from the variables between two steps (eager reads at a process's first save, while the
writer thread traces that function). TensorFlow gives a read tensor value semantics:
an update of a variable whose buffer a read still holds copies the buffer first (copy on
write: `assign_sub` of the weights copies them once, on the device; `assign` of the AdamW
moments just swaps buffers). A background thread then moves the tensors to host memory (on a
GPU, device-to-host copies off the training thread; on a CPU, views) and lets the tensors go,
then writes the .npz without another copy, syncs, renames and prunes while the next steps run.
The price: until the copies to host are done the device holds the snapshot's buffers besides
the live ones (at most one more copy of the state). `bench/checkpoint.py` measures the stall
against the earlier snapshot (a host copy of every variable on the training thread).

On SageMaker a spot interruption or a stop cannot be counted on to reach the training
processes (the toolkit does not forward SIGTERM; MPI workers are killed without a save), so
periodic checkpoints are the protection: every `checkpoint_every` steps and every
`checkpoint_minutes` of training (`SaveClock`).

Exact resume also needs the data and the randomness to be the same: the metadata records the
dataset's fingerprint (`lm.shards.fingerprint`) and `check_dataset` refuses other data unless
told to; dropout draws its masks from `DropoutKey`, a function of (seed, step, replica) only.
"""
import concurrent.futures
import json
import os
import re
import threading
import time
import zipfile

import numpy as np

PATTERN = re.compile(r"^ckpt-(\d{8})(.*)\.npz$")
META_KEY = "__meta__"
# Replica indices below this share no dropout key (the key is step * REPLICA_STRIDE + replica).
REPLICA_STRIDE = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model being trained; names the file."""


def checkpoint_name(step, tag=""):
    return "ckpt-%08d%s.npz" % (step, tag)


class Checkpointer:
    """Saves and finds checkpoints in `directory`; `tag` separates ranks that hold different variables.

    With `background` (the default) `save` returns once it holds a snapshot of the values and
    one thread writes the file; `wait()` returns when it is on disk (and raises what the write
    raised). A save while the previous write still runs waits for it first.
    """

    def __init__(self, directory, tag="", keep=2, background=True):
        self.directory, self.tag, self.keep = directory, tag, keep
        self._writer = concurrent.futures.ThreadPoolExecutor(1, initializer=_yield_to_training) if background else None
        self._pending = None
        self._reader = (None, None)

    def steps(self):
        """Steps of the complete checkpoints with this tag, oldest first (after the pending write)."""
        self.wait()
        return self._steps_on_disk()

    def _steps_on_disk(self):
        if not os.path.isdir(self.directory):
            return []
        found = []
        for name in os.listdir(self.directory):
            match = PATTERN.match(name)
            if match and match.group(2) == self.tag:
                found.append(int(match.group(1)))
        return sorted(found)

    def path(self, step):
        return os.path.join(self.directory, checkpoint_name(step, self.tag))

    def latest(self):
        steps = self.steps()
        return self.path(steps[-1]) if steps else None

    def save(self, step, variables, meta):
        """Save the values of `variables` at `step`; keep the newest `keep`. Returns the final path."""
        self.wait()
        values = self._snapshot(variables)
        meta = dict(meta, step=step, shapes=[list(variable.shape) for variable in variables])
        if self._writer is None:
            return self._write(step, values, meta)
        self._pending = self._writer.submit(self._write, step, values, meta)
        return self.path(step)

    def _snapshot(self, variables):
        """The variables' values now, as tensors that later updates do not change (see the module doc)."""
        key = tuple(id(variable) for variable in variables)
        if self._reader[0] == key:
            return self._reader[1]()
        from lm.compat import tf

        variables = list(variables)
        # One call instead of one eager op per variable; tracing it takes seconds for a large
        # model, so the first save reads eagerly and the writer thread traces it beside training.
        reader = tf.function(lambda: [variable.read_value() for variable in variables], autograph=False)
        self._reader = (key, reader)
        if self._writer is not None:
            self._writer.submit(reader.get_concrete_function)
        return [variable.read_value() for variable in variables]

    def writing(self):
        """True while a background write is in flight."""
        return self._pending is not None and not self._pending.done()

    def wait(self):
        """Block until the last save is on disk; re-raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _write(self, step, values, meta):
        os.makedirs(self.directory, exist_ok=True)
        path = self.path(step)
        tmp = "%s.tmp-%d" % (path, os.getpid())
        # All to host memory first (on a GPU, device-to-host copies), so the snapshot's device
        # buffers are released before the slower write to disk.
        arrays = [np.asarray(value) for value in values]
        del values[:]
        with open(tmp, "wb") as handle:
            write_npz(handle, arrays, json.dumps(meta, sort_keys=True).encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        for old in self._steps_on_disk()[:-self.keep] if self.keep else []:
            os.remove(self.path(old))
        return path


def write_npz(handle, arrays, meta_json):
    """What `np.savez(handle, v00000=..., __meta__=...)` writes, without its copy of every array."""
    with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for index, array in enumerate(arrays):
            _write_npy(archive, "v%05d" % index, array)
        _write_npy(archive, META_KEY, np.frombuffer(meta_json, np.uint8))


def _write_npy(archive, name, array):
    array = np.require(array, requirements="C")  # not ascontiguousarray: it makes scalars 1-d
    with archive.open(name + ".npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_1_0(member, np.lib.format.header_data_from_array_1_0(array))
        member.write(array.reshape(-1).view(np.uint8).data)


def _yield_to_training():
    """Lowest CPU priority for the writer thread (Linux schedules threads by their own nice
    value), so where cores are short the write waits for the training threads, not the reverse."""
    if hasattr(os, "setpriority") and hasattr(threading, "get_native_id"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass


def read_meta(path):
    with np.load(path) as data:
        return json.loads(bytes(data[META_KEY]).decode("utf-8"))


def restore(path, variables):
    """Assign a checkpoint's arrays to `variables` (same order and shapes). Returns its metadata."""
    try:
        with np.load(path) as data:
            meta = json.loads(bytes(data[META_KEY]).decode("utf-8"))
            arrays = [data["v%05d" % index] for index in range(len(meta["shapes"]))]
    except (OSError, KeyError, ValueError) as error:
        raise CheckpointError("%s: not a readable checkpoint: %s" % (path, error))
    if len(arrays) != len(variables):
        raise CheckpointError("%s: holds %d variables, the model being trained has %d (different model?)"
                              % (path, len(arrays), len(variables)))
    for index, (array, variable) in enumerate(zip(arrays, variables)):
        if tuple(array.shape) != tuple(variable.shape):
            raise CheckpointError("%s: variable %d (%s) has shape %s, the model has %s"
                                  % (path, index, variable.name, array.shape, tuple(variable.shape)))
    for array, variable in zip(arrays, variables):
        variable.assign(array)
    return meta


class SaveClock:
    """When a time-based checkpoint is due: `interval_seconds` (0: never) after the last save.

    Ranks see different clocks, so the caller agrees on the elapsed time first (for example
    the mean over all ranks) and passes that to `due`: then every rank decides alike.
    """

    def __init__(self, interval_seconds, clock=time.monotonic):
        self.interval_seconds, self._clock = interval_seconds, clock
        self._since = clock()

    def elapsed(self):
        return self._clock() - self._since

    def due(self, agreed_elapsed):
        return bool(self.interval_seconds) and agreed_elapsed >= self.interval_seconds

    def saved(self):
        self._since = self._clock()


def check_dataset(meta, fingerprint, allow_new_data, path):
    """Refuse to resume a checkpoint on data other than its own unless `allow_new_data`.

    Returns True when the data differ (and that was allowed)."""
    recorded = meta.get("dataset_fingerprint")
    if recorded == fingerprint:
        return False
    if allow_new_data:
        return True
    was = "dataset %s" % recorded if recorded else "a dataset it does not record"
    raise CheckpointError(
        "%s: was trained on %s, this run's dataset is %s. Resuming on other data does not continue the "
        "same run (its batches differ from the ones an uninterrupted run would see); to do it anyway, set "
        "hyperparameters.allow_new_data=true (--allow-new-data), or use another --checkpoint-dir"
        % (path, was, fingerprint))


class DropoutKey:
    """The stateless seed of a train step's dropout masks: a function of (seed, step, replica).

    `attach(model)` makes the model draw its masks from it (`lm.model.GPT.dropout_key`); call
    `count_steps_of(variable)` with the optimizer's step counter, which checkpoints restore, so
    step s of a resumed run draws the masks step s of an uninterrupted run draws. The replica is
    the replica context's index under a tf.distribute strategy (every local GPU of MWMS), else
    this process's data-parallel rank.
    """

    def __init__(self, seed, data_parallel_rank):
        self.seed, self.data_parallel_rank = seed, data_parallel_rank
        self._step = None

    def attach(self, model):
        model.dropout_key = self
        return model

    def count_steps_of(self, step_variable):
        self._step = step_variable

    def __call__(self):
        from lm.compat import tf

        if self._step is None:
            raise RuntimeError("DropoutKey: count_steps_of(optimizer.step) was not called before training")
        replica = self.data_parallel_rank
        if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        step = tf.cast(tf.convert_to_tensor(self._step), tf.int64)
        return tf.stack([tf.constant(self.seed, tf.int64), step * REPLICA_STRIDE + tf.cast(replica, tf.int64)])
