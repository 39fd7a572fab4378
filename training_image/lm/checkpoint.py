"""Training checkpoints, and what makes a resume exact.

    <dir>/ckpt-<step, 8 digits><tag>.npz

A module of `lm` itself, below its subpackages: the training loop (`lm.training.train`) and the
strategies that decide which ranks write (`lm.distributed.base.Checkpoints`) both read it.

Every state variable as a NumPy array, plus a little metadata. Written under a temporary
name and renamed, so a file with the final name is always complete and the newest one is
safe to resume from. The variables are saved in a fixed order (model weights, optimizer
state, loss scale) with their shapes, and checked on load. NumPy files read the same on every
TF version we run, unlike Keras' checkpoint layouts.

A save takes its snapshot in host memory, on the training thread, between two steps
(`host_snapshot`): every state variable is read and copied into a NumPy array that shares no
buffer with it (on a GPU, one device-to-host copy per variable; on a CPU, a copy in memory), so
the arrays hold the weights and optimizer state of one step whatever the next steps do. The
device holds nothing more than training needs: controlplane.planner counts the snapshot (12 bytes
a parameter in fp32: the weights, AdamW's m and v) in the chief's host memory, not on its GPU.
The price is the copy itself, a stall of the training thread for the state's size over the
device-to-host bandwidth once per save (`bench/checkpoint.py` measures it beside the snapshot this
replaced, which held the reads on the device until the writer had copied them: the next update
then copied every buffer it wrote, 12 to 13 bytes a parameter more on the device until the
copies were done). A background thread then writes the .npz from the arrays without another
copy, syncs, renames and prunes while the next steps run; the arrays are freed when the file is
written, and a save waits for the previous write first, so the host holds one snapshot at most.

What the write costs training is its CPU time (the zip's CRC-32, the copy into the page cache,
the sync: about 0.15 s per 200 MB) wherever no core is idle for it, as on a CPU host whose
steps use every core. So the writer runs at the lowest priority and is paced (`Pacer`): it writes
8 MB at a time and, while fewer than one core of the machine is idle (`IdleCores`, from
/proc/stat), sleeps after each piece so that it uses at most `writer_share` (2 %) of one core,
so that no step loses more than about 2 % of its time; the file lands over several steps
(about 50 times its CPU time). Where a core is idle (a GPU host: the step runs on the GPU)
it writes at full speed. `wait()` ends the pacing: its caller trains no more until the file is
on disk. `bench/checkpoint.py` measures the stall per step and per save against the unpaced
writer.

On SageMaker a spot interruption or a stop cannot be counted on to reach the training
processes (the toolkit does not forward SIGTERM; MPI workers are killed without a save), so
periodic checkpoints are the protection: every `checkpoint_every` steps and every
`checkpoint_minutes` of training (`SaveClock`).

Exact resume also needs the data and the randomness to be the same: the metadata records the
dataset's fingerprint (`lm.spec.shards.fingerprint`) and `check_dataset` refuses other data unless
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
# While no core is idle, the writer thread uses at most this share of one core (see the module doc).
WRITER_SHARE = 0.02
CHUNK_BYTES = 8 << 20


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model being trained; names the file."""


# Where a checkpoint of another run comes from, and how to start afresh instead: on SageMaker an execution
# trains under its own prefix unless its input's resume_from names another's.
OTHER_CHECKPOINTS = ("the checkpoints are another run's: on SageMaker leave resume_from out of the execution "
                     "input (or name the checkpoints of this model and dataset), locally use another --checkpoint-dir")


def checkpoint_name(step, tag=""):
    return "ckpt-%08d%s.npz" % (step, tag)


class Checkpointer:
    """Saves and finds checkpoints in `directory`; `tag` separates ranks that hold different variables.

    With `background` (the default) `save` returns once it holds a snapshot of the values in host
    memory and one thread writes the file, paced to `writer_share` of one core while no core is
    idle (1: not paced); `wait()` ends the pacing and returns when the file is on disk (and raises
    what the write raised). A save while the previous write still runs waits for it first.
    """

    def __init__(self, directory, tag="", keep=2, background=True, writer_share=WRITER_SHARE):
        if not 0 < writer_share <= 1:
            raise ValueError("writer_share must be in (0, 1] (a share of one core), got %r" % (writer_share,))
        self.directory, self.tag, self.keep, self.writer_share = directory, tag, keep, writer_share
        self._writer = concurrent.futures.ThreadPoolExecutor(1, initializer=_yield_to_training) if background else None
        self._pending = None
        self._hurry = threading.Event()
        self._idle_cores = IdleCores() if background and writer_share < 1 else None

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

    def discard_after(self, step):
        """Remove the checkpoints of steps after `step` (a rollback's: they hold the diverged weights)."""
        for newer in self.steps():
            if newer > step:
                os.remove(self.path(newer))

    def latest(self):
        steps = self.steps()
        return self.path(steps[-1]) if steps else None

    def save(self, step, variables, meta):
        """Save the values of `variables` at `step`; keep the newest `keep`. Returns the final path.

        Returns once the values are copied into host memory (`host_snapshot`): later updates of
        the variables do not change what is written."""
        self.wait()
        arrays = self.take_snapshot(variables)
        meta = dict(meta, step=step, shapes=[list(array.shape) for array in arrays])
        if self._writer is None:
            return self._write(step, arrays, meta, lambda: None)
        self._hurry = threading.Event()
        pacer = Pacer(self.writer_share, self._hurry, self._idle_cores) if self._idle_cores else None
        self._pending = self._writer.submit(self._write, step, arrays, meta, pacer.chunk_done if pacer else lambda: None)
        return self.path(step)

    def take_snapshot(self, variables):
        """What `save` writes: `host_snapshot(variables)` (bench/checkpoint.py's reference replaces it with
        the device snapshot it measures against)."""
        return host_snapshot(variables)

    def writing(self):
        """True while a background write is in flight."""
        return self._pending is not None and not self._pending.done()

    def wait(self):
        """Block until the last save is on disk (written at full speed from now on); re-raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._hurry.set()
            pending.result()

    def _write(self, step, arrays, meta, chunk_done):
        os.makedirs(self.directory, exist_ok=True)
        path = self.path(step)
        tmp = "%s.tmp-%d" % (path, os.getpid())
        with open(tmp, "wb") as handle:
            write_npz(handle, arrays, json.dumps(meta, sort_keys=True).encode("utf-8"), chunk_done)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        for old in self._steps_on_disk()[:-self.keep] if self.keep else []:
            os.remove(self.path(old))
        return path


def host_snapshot(variables):
    """The values of `variables` now, as NumPy arrays in host memory that share no buffer with them.

    A read of a variable on a GPU converts to NumPy by a copy into host memory, which the array
    keeps; on a CPU the conversion is a view of the variable's own buffer, which the next update
    would change (or copy on write), so it is copied."""
    from lm.compat import tf

    arrays = []
    for variable in variables:
        value = variable.read_value()
        array = np.asarray(value)
        on_host = tf.DeviceSpec.from_string(value.device).device_type in (None, "CPU")
        arrays.append(array.copy() if on_host else array)
    return arrays


def write_npz(handle, arrays, meta_json, chunk_done=lambda: None):
    """What `np.savez(handle, v00000=..., __meta__=...)` writes, without its copy of every array;
    calls `chunk_done()` after every CHUNK_BYTES (or smaller array) written."""
    with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for index, array in enumerate(arrays):
            _write_npy(archive, "v%05d" % index, array, chunk_done)
        _write_npy(archive, META_KEY, np.frombuffer(meta_json, np.uint8), chunk_done)


def _write_npy(archive, name, array, chunk_done):
    array = np.require(array, requirements="C")  # not ascontiguousarray: it makes scalars 1-d
    with archive.open(name + ".npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_1_0(member, np.lib.format.header_data_from_array_1_0(array))
        data = array.reshape(-1).view(np.uint8).data
        for start in range(0, len(data), CHUNK_BYTES):
            member.write(data[start:start + CHUNK_BYTES])
            chunk_done()


class Pacer:
    """Keeps a writer thread to `share` of one core while fewer than one core is idle.

    `chunk_done()` after each piece written: unless `idle_cores()` reports a whole core idle or
    `hurry` (a threading.Event) is set, it waits on `hurry` for as long as makes the CPU time the
    writer used since the previous piece `share` of the time it took.
    """

    def __init__(self, share, hurry, idle_cores, cpu_clock=time.thread_time):
        self.share, self.hurry, self.idle_cores, self._cpu_clock = share, hurry, idle_cores, cpu_clock
        self._cpu = cpu_clock()

    def chunk_done(self):
        used = self._cpu_clock() - self._cpu
        if self.share < 1 and not self.hurry.is_set() and self.idle_cores() < 1:
            self.hurry.wait(used * (1 - self.share) / self.share)
        self._cpu = self._cpu_clock()


class IdleCores:
    """How many cores of this machine were idle, from /proc/stat's counters, over the last window of
    at least `window` seconds (the counters tick every 10 ms). 0 until a window has passed, and
    where /proc/stat cannot be read (then the writer is always paced)."""

    def __init__(self, window=0.25, path="/proc/stat", clock=time.monotonic, cores=None):
        self.window, self.path, self._clock = window, path, clock
        self.cores = cores or os.cpu_count() or 1
        self.value = 0.0
        self._since, self._counters = clock(), self._read()

    def _read(self):
        """(idle ticks, all ticks) summed over the CPUs, or None."""
        try:
            with open(self.path) as handle:
                fields = handle.readline().split()
            ticks = [int(field) for field in fields[1:9]]  # user nice system idle iowait irq softirq steal
        except (OSError, ValueError):
            return None
        if not fields or fields[0] != "cpu" or len(ticks) < 5:
            return None
        return ticks[3] + ticks[4], sum(ticks)

    def __call__(self):
        now = self._clock()
        if now - self._since >= self.window:
            counters = self._read()
            if counters and self._counters and counters[1] > self._counters[1]:
                idle, total = (new - old for new, old in zip(counters, self._counters))
                self.value = self.cores * idle / total
            self._since, self._counters = now, counters
        return self.value


def _yield_to_training():
    """Lowest CPU priority for the writer thread (Linux schedules threads by their own nice
    value), so where cores are short the write waits for the training threads, not the reverse."""
    if hasattr(os, "setpriority") and hasattr(threading, "get_native_id"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass


# What np.load raises on a file that is not a complete checkpoint (a truncated or altered zip,
# a CRC-32 mismatch, another format, a missing member).
_UNREADABLE = (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile)


def read_meta(path):
    try:
        with np.load(path) as data:
            return json.loads(bytes(data[META_KEY]).decode("utf-8"))
    except _UNREADABLE as error:
        raise CheckpointError("%s: not a readable checkpoint: %s" % (path, error))


def restore(path, variables):
    """Assign a checkpoint's arrays to `variables` (same order and shapes). Returns its metadata.
    Every array is read (and its CRC-32 checked) before any variable is assigned."""
    try:
        with np.load(path) as data:
            meta = json.loads(bytes(data[META_KEY]).decode("utf-8"))
            arrays = [data["v%05d" % index] for index in range(len(meta["shapes"]))]
    except _UNREADABLE as error:
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
        "hyperparameters.allow_new_data=true (--allow-new-data); otherwise %s"
        % (path, was, fingerprint, OTHER_CHECKPOINTS))


class DropoutKey:
    """The stateless seed of a train step's dropout masks: a function of (seed, step, replica).

    `attach(model)` makes the model draw its masks from it (`lm.models.gpt.GPT.dropout_key`); call
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
