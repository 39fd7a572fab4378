"""FAKE `smdistributed.modelparallel.tensorflow` (SMP v1) for tests: NOT AWS's library.

Written from the library's documentation (SageMaker Python SDK v2,
doc/api/training/smp_versions/latest/smd_model_parallel_common_api.rst ("Common API":
smp.init, smp.step, StepOutput, MPI basics, CommGroup / RankType, broadcast, send, recv_from,
allgather, barrier), .../smd_model_parallel_tensorflow.rst ("TensorFlow API": DistributedModel,
save_model, smp.partition, smp.CheckpointManager, register_post_partition_hook),
doc/api/training/smd_model_parallel_general.rst ("Parameters for modelparallel",
"Ranking Basics") and the developer guide's "Modify a TensorFlow Training Script"
(unsupported: tf.GradientTape, tf.train.Checkpoint.restore; restores after the first step)).
Only what those pages list exists here; a call, argument or value they do not allow raises.

Ranks are threads of one process (`run_ranks(size, target)`), each with its own state, model
object and variables. Without `run_ranks` the process is one rank whose place in the layout
comes from FAKE_SMP_RANK / FAKE_SMP_SIZE: rank queries work, any collective raises (its peers
are not running), so no call answers for a peer that does not exist.

What the fake emulates, and where it simplifies:
- Placement: the model is partitioned in the first `smp.step` call ("after the model is
  partitioned during the first call to smp.step", register_post_partition_hook). Each
  variable the DistributedModel creates then lives on exactly one rank of the mp group: with
  `auto_partition: false` the rank whose mp_rank is the innermost `smp.partition` index at
  creation (else `default_partition`); with auto-partitioning (the default) the library
  decides, and the fake assigns variables round-robin in creation order, a placement the
  caller must cope with like any other. `model.variables` / `trainable_variables` / `weights`
  on a rank are that rank's variables only.
- Compute is not pipelined: every rank of an mp group runs the whole forward and backward
  pass, reading the variables other ranks hold (their storage, never a copy), so each rank's
  gradients are exact for its own variables. Each `smp.step` call starts and ends with an
  mp-group barrier, so no rank reads a variable while its owner updates it; inside a
  tf.function the barriers are ops that hold one TensorFlow inter-op thread per rank.
- From the library's own code (the 1.12.1 wheel's Python source, GitHub
  tkazusa/smdistributed_modelparallel; the TF 2.6 DLC ships 1.4.0, which was not read):
  DistributedModel's base class (TensorFlow's bundled Keras), the tracing copy made from the
  arguments read in the frame that called DistributedModel.__init__, its shared-layer check and
  the per-rank build of the layers `get_layers` lists (through `_layers`), count_params failing,
  custom gradients failing on the ranks that import the graph (DistributedModel), the 2 GiB limit
  of a message and the checkpoint transfer chunk for bytes (the collectives), StepOutput.accumulate's accumulators in a tf.function, and
  CheckpointManager.restore reading every partition's directory. Where they are emulated, the
  code cites file and lines. Not
  emulated: the graph import itself (a rank's layers list only its own weights, but their
  attributes still reach other ranks' variables here; the library's ranks do not build those).
- Tensors returned by `DistributedModel.call` are "broadcast across model-parallel devices";
  the fake records their shapes and bytes (`smp.DistributedModel.output`).
- Collectives (`allgather`, `broadcast` / `recv_from`, `send`, `barrier`) run over the rank
  lists of the documented groups (WORLD, MP_GROUP, DP_GROUP, RDP_GROUP = DP_GROUP without
  tensor parallelism), exchanging pickled copies. A peer that does not arrive within
  FAKE_SMP_TIMEOUT seconds (default 60) makes the call raise: a hang becomes an error.
- `smp.CheckpointManager` saves, on each rank, only the variables that rank holds, in the fake's
  own files (one set per partition under the manager's directory), and `restore()` (only after
  the model is partitioned) reads the newest of this partition's; see the class.
- With "horovod": true, init() initializes Horovod ("smp.init() initializes Horovod"; scripts
  must never call hvd.init). One process without run_ranks: the real Horovod of the process.
  Under run_ranks the threads cannot share that one, so run_ranks puts the fake Horovod of
  fake_horovod.py in sys.modules as `horovod.tensorflow` while it runs: on each rank it spans
  the rank's dp group (hvd.rank() == dp_rank(), hvd.size() == dp_size()) and its allreduce and
  broadcast_variables exchange real values with the group's other ranks (see that module).
"""
import contextlib
import enum
import functools
import inspect
import json
import os
import pickle
import random
import sys
import threading

import numpy as np

from lm.compat import keras, tf
from smdistributed import env_int, record
# The library's base class (v2/model.py line 14): TensorFlow's bundled Keras, not `tf.keras`.
from tensorflow.python.keras.models import Model  # noqa: E402

FAKE = "fake smdistributed.modelparallel"
TIMEOUT_ENV = "FAKE_SMP_TIMEOUT"
MESSAGE_LIMIT_ENV = "FAKE_SMP_MESSAGE_BYTES"
# "Parameters for modelparallel" that apply to TensorFlow, with their documented defaults.
PARAMETERS = {"partitions": None, "microbatches": 1, "pipeline": "interleaved", "optimize": "memory",
              "placement_strategy": "cluster", "auto_partition": True, "default_partition": 0, "contiguous": True,
              "horovod": False}
CHOICES = {"pipeline": ("interleaved", "simple"), "optimize": ("memory", "speed"),
           "placement_strategy": ("cluster", "spread")}
BOOLEANS = ("auto_partition", "contiguous", "horovod")


class CommGroup(enum.Enum):
    WORLD = "world"
    MP_GROUP = "mp_group"
    DP_GROUP = "dp_group"
    RDP_GROUP = "rdp_group"


class RankType(enum.Enum):
    WORLD_RANK = "world_rank"
    MP_RANK = "mp_rank"
    DP_RANK = "dp_rank"


WORLD, MP_GROUP, DP_GROUP = CommGroup.WORLD, CommGroup.MP_GROUP, CommGroup.DP_GROUP


class FakeHang(RuntimeError):
    """A collective whose peers did not all arrive: on the real library, a hang."""


class _World:
    """What the ranks of one fake job share: exchange slots, mailboxes, the placed variables."""

    def __init__(self, size):
        self.size = size
        self.lock = threading.Condition()
        self.slots = {}
        self.mailboxes = {}
        self.placed = {}     # (mp group, creation index) -> (variable, owning rank)
        self.broken = None
        self.first_failure = None

    def wait(self, predicate, what):
        timeout = float(os.environ.get(TIMEOUT_ENV) or 60)
        if not self.lock.wait_for(lambda: predicate() or self.broken, timeout):
            self.broken = "%s timed out after %.0f s" % (what, timeout)
            self.lock.notify_all()
            raise FakeHang("%s: %s (on the real library: a hang)" % (FAKE, self.broken))
        if self.broken:
            raise FakeHang("%s: %s, while another rank %s" % (FAKE, what, self.broken))


_local = threading.local()
_process_world = {"world": None}


def _state():
    if not hasattr(_local, "state"):
        _local.state = {"initialized": False, "config": None, "in_step": False, "partitioned": False,
                        "world": _process_world["world"], "rank": None, "sequence": {}, "hooks": [],
                        "created": 0, "partition_stack": [], "owned": set(), "horovod": False}
    return _local.state


def reset():
    """Test helper (not part of the library): forget init in this thread."""
    if hasattr(_local, "state"):
        del _local.state


def run_ranks(size, target, *args):
    """Test helper (not part of the library): run `target(*args)` as ranks 0..size-1 of one job,
    one thread each; returns their results in rank order and re-raises the first error."""
    world = _World(size)
    results, errors = [None] * size, [None] * size

    def main(rank):
        reset()
        state = _state()
        state.update(world=world, rank=rank)
        try:
            results[rank] = target(*args)
        except BaseException as error:  # noqa: B036 - reported to the caller below
            errors[rank] = error
            with world.lock:
                if world.broken is None:
                    world.broken, world.first_failure = "rank %d failed: %s: %s" % (rank, type(error).__name__,
                                                                                    error), rank
                world.lock.notify_all()
        finally:
            reset()

    threads = [threading.Thread(target=main, args=(rank,), name="fake-smp-rank-%d" % rank) for rank in range(size)]
    from smdistributed.modelparallel import fake_horovod
    with fake_horovod.installed():
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    # The error of the rank that failed first; the others' (a FakeHang, or TensorFlow's error around
    # one raised in a graph) follow from it.
    first = errors[world.first_failure] if world.first_failure is not None else next(
        (error for error in errors if error is not None and not isinstance(error, FakeHang)),
        next((error for error in errors if error is not None), None))
    if first is not None:
        raise first
    return results


def _require_init(name):
    if not _state()["initialized"]:
        raise RuntimeError("%s: smp.%s() before smp.init()" % (FAKE, name))


def _read_parameters():
    raw = os.environ.get("SM_HP_MP_PARAMETERS")
    config = json.loads(raw) if raw else {}
    unknown = sorted(set(config) - set(PARAMETERS))
    if unknown:
        raise ValueError("%s: mp_parameters %s are not TensorFlow parameters of SMP v1 (allowed: %s)"
                         % (FAKE, ", ".join(unknown), ", ".join(PARAMETERS)))
    if "partitions" not in config:
        raise ValueError("%s: mp_parameters need 'partitions'" % FAKE)
    if config.get("auto_partition") is False and "default_partition" not in config:
        raise ValueError("%s: default_partition is required when auto_partition is false" % FAKE)
    for name in ("partitions", "microbatches", "default_partition"):
        if name in config and (not isinstance(config[name], int) or isinstance(config[name], bool)):
            raise ValueError("%s: mp_parameters.%s must be an int, got %r" % (FAKE, name, config[name]))
    for name, choices in CHOICES.items():
        if name in config and config[name] not in choices:
            raise ValueError("%s: mp_parameters.%s must be one of %s" % (FAKE, name, choices))
    for name in BOOLEANS:
        if name in config and not isinstance(config[name], bool):
            raise ValueError("%s: mp_parameters.%s must be a bool" % (FAKE, name))
    values = dict(PARAMETERS)
    values.update(config)
    if not 0 <= values["default_partition"] < values["partitions"]:
        raise ValueError("%s: default_partition must be below partitions" % FAKE)
    return values


def init():
    state = _state()
    if state["initialized"]:
        raise RuntimeError("%s: smp.init() called twice" % FAKE)
    config = _read_parameters()
    world = state["world"]
    if world is None:
        state.update(rank=env_int("FAKE_SMP_RANK", 0), size=env_int("FAKE_SMP_SIZE", config["partitions"]))
    else:
        state["size"] = world.size
    if state["size"] % config["partitions"]:
        raise ValueError("%s: %d processes are not a multiple of partitions=%d"
                         % (FAKE, state["size"], config["partitions"]))
    state.update(initialized=True, config=config)
    record("smp.init", mp_parameters=config, rank=state["rank"])
    if config["horovod"]:
        # "smp.init() initializes Horovod": under run_ranks, the fake Horovod of the rank threads
        # (fake_horovod, spanning this rank's dp group); in one process, the real one.
        if world is not None:
            state["horovod"] = True
        else:
            import horovod.tensorflow as hvd
            hvd.init()


def _config():
    return _state()["config"]


# ---- ranks ("MPI Basics" and "Ranking Basics without Tensor Parallelism") ----

def size():
    _require_init("size")
    return _state()["size"]


def rank():
    _require_init("rank")
    return _state()["rank"]


def local_size():
    _require_init("local_size")
    return env_int("FAKE_SMP_LOCAL_SIZE", size())


def local_rank():
    _require_init("local_rank")
    return rank() % local_size()


def mp_size():
    _require_init("mp_size")
    return _config()["partitions"]


def dp_size():
    _require_init("dp_size")
    return size() // mp_size()


def _layout(world_rank):
    """(mp_rank, dp_rank) of a rank: cluster puts one replica on neighbouring ranks, spread far apart."""
    if _config()["placement_strategy"] == "cluster":
        return world_rank % mp_size(), world_rank // mp_size()
    return world_rank // dp_size(), world_rank % dp_size()


def mp_rank():
    _require_init("mp_rank")
    return _layout(rank())[0]


def dp_rank():
    _require_init("dp_rank")
    return _layout(rank())[1]


rdp_rank, rdp_size = dp_rank, dp_size


def get_mp_group():
    _require_init("get_mp_group")
    return [r for r in range(size()) if _layout(r)[1] == dp_rank()]


def get_dp_group():
    _require_init("get_dp_group")
    return [r for r in range(size()) if _layout(r)[0] == mp_rank()]


def _members(group):
    if not isinstance(group, CommGroup):
        raise TypeError("%s: group must be an smp.CommGroup, got %r" % (FAKE, group))
    if group is CommGroup.WORLD:
        return list(range(size()))
    return get_mp_group() if group is CommGroup.MP_GROUP else get_dp_group()


def _peer(peer_rank, rank_type):
    if not isinstance(rank_type, RankType):
        raise TypeError("%s: rank_type must be an smp.RankType, got %r" % (FAKE, rank_type))
    members = {RankType.WORLD_RANK: list(range(size())), RankType.MP_RANK: get_mp_group(),
               RankType.DP_RANK: get_dp_group()}[rank_type]
    if not isinstance(peer_rank, int) or not 0 <= peer_rank < len(members):
        raise ValueError("%s: rank %r is not a %s of %d ranks" % (FAKE, peer_rank, rank_type.name, len(members)))
    return members[peer_rank]


def _world(call):
    world = _state()["world"]
    if world is None and size() > 1:
        raise RuntimeError("%s: smp.%s needs the other %d ranks, which do not run in this process "
                           "(FAKE_SMP_SIZE without run_ranks)" % (FAKE, call, size() - 1))
    return world


# ---- communication ("Communication API") ----

def _message(call, obj):
    """`obj` pickled, as the library sends it: it passes the pickle's size to its backend as a C int
    (backend/collectives.py: `_serialize_object` and `pickle_obj`, lines 334-348; `ctypes.c_int(count)`
    in `async_bcast_global`, lines 237-247, which allgather and broadcast use, and `async_send_global`,
    lines 254-263, which send uses), so a message holds at most 2**31 - 1 bytes (ctypes wraps a larger
    count silently). Tests scale the limit down with FAKE_SMP_MESSAGE_BYTES. Bytes travel in pieces of at
    most the library's own transfer chunk (`_check_transfer_chunk`)."""
    _check_transfer_chunk(call, obj)
    payload = pickle.dumps(obj)
    limit = env_int(MESSAGE_LIMIT_ENV, 2 ** 31 - 1)
    if len(payload) > limit:
        raise OverflowError("%s: smp.%s of an object that pickles to %d bytes: the library passes a message's size "
                            "as a C int, so one message holds at most %d bytes" % (FAKE, call, len(payload), limit))
    return payload


def _check_transfer_chunk(call, obj):
    """The library sends its own checkpoint files' bytes in pieces of at most SMP_CKPT_TRANSFER_CHUNK_SIZE
    bytes, 1 GiB when unset, "as ctypes string_buffer adds this limitation" (tensorflow/utils.py,
    get_transfer_chunk_size and break_data, lines 564-585): the fake holds bytes sent through its
    collectives to the same chunk. Tests scale it down by setting that variable."""
    chunk = env_int("SMP_CKPT_TRANSFER_CHUNK_SIZE", 1024 ** 3)
    if isinstance(obj, (bytes, bytearray)) and len(obj) > chunk:
        raise OverflowError("%s: smp.%s of %d bytes: the library moves bytes in pieces of at most "
                            "SMP_CKPT_TRANSFER_CHUNK_SIZE = %d bytes (ctypes string_buffer)" % (FAKE, call, len(obj), chunk))


def _exchange(call, group, obj):
    """Every member of `group` contributes `obj`; returns the contributions in member order. Alone in
    its group, the library returns the object as it is, unsent (collectives.py lines 190-191)."""
    members = _members(group)
    if len(members) > 1:
        _message(call, obj)
    if _world(call) is None:
        return [pickle.loads(pickle.dumps(obj))]
    return exchange_among(_state(), members, tuple(members), call, obj, "smp.%s over %s" % (call, group.name))


def exchange_among(state, members, key, call, obj, what):
    """The rank of `state` (a rank thread's state: this helper may run on another thread) and
    every other rank in `members` contribute an object to their next exchange on channel `key`;
    returns the contributions in member order. (Not part of the library: the fake Horovod uses it.)"""
    world = state["world"]
    payload = pickle.dumps(obj)
    sequence = state["sequence"].get(key, 0)
    state["sequence"][key] = sequence + 1
    slot_key = (key, sequence)
    with world.lock:
        slot = world.slots.setdefault(slot_key, {"values": {}, "read": 0})
        slot["values"][state["rank"]] = (call, payload)
        world.lock.notify_all()
        world.wait(lambda: len(slot["values"]) == len(members),
                   "%s: rank %d waited for ranks %s" % (what, state["rank"], members))
        calls = {name for name, _ in slot["values"].values()}
        if len(calls) > 1:
            raise RuntimeError("%s: ranks %s made different collective calls %s" % (FAKE, members, sorted(calls)))
        values = [pickle.loads(slot["values"][member][1]) for member in members]
        slot["read"] += 1
        if slot["read"] == len(members):
            del world.slots[slot_key]
    return values


def allgather(obj, group):
    _require_init("allgather")
    record("smp.allgather", group=group.name if isinstance(group, CommGroup) else repr(group))
    return _exchange("allgather", group, obj)


def barrier(group=CommGroup.WORLD):
    _require_init("barrier")
    record("smp.barrier", group=group.name if isinstance(group, CommGroup) else repr(group))
    _exchange("barrier", group, None)


def dp_barrier():
    barrier(CommGroup.DP_GROUP)


def mp_barrier():
    barrier(CommGroup.MP_GROUP)


def _post(call, destinations, obj):
    world = _world(call)
    me = _state()["rank"]
    payload = _message(call, obj)
    with world.lock:
        for destination in destinations:
            world.mailboxes.setdefault((me, destination), []).append([payload, False])
        world.lock.notify_all()
        entries = [world.mailboxes[(me, d)][-1] for d in destinations]
        world.wait(lambda: all(entry[1] for entry in entries),
                   "smp.%s from rank %d: ranks %s did not call recv_from" % (call, me, destinations))


def broadcast(obj, group):
    _require_init("broadcast")
    record("smp.broadcast", group=group.name if isinstance(group, CommGroup) else repr(group))
    members = _members(group)
    if _world("broadcast") is not None:
        _post("broadcast", [m for m in members if m != rank()], obj)


def send(obj, dest_rank, rank_type):
    _require_init("send")
    destination = _peer(dest_rank, rank_type)
    record("smp.send", rank=rank(), destination=destination, bytes=len(pickle.dumps(obj)))
    _post("send", [destination], obj)


def recv_from(src_rank, rank_type):
    _require_init("recv_from")
    source = _peer(src_rank, rank_type)
    world = _world("recv_from")
    me = _state()["rank"]
    with world.lock:
        queue = world.mailboxes.setdefault((source, me), [])
        world.wait(lambda: any(not entry[1] for entry in queue),
                   "smp.recv_from on rank %d: rank %d sent nothing" % (me, source))
        entry = next(entry for entry in queue if not entry[1])
        entry[1] = True
        world.lock.notify_all()
        return pickle.loads(entry[0])


# ---- smp.step and StepOutput ----

class StepOutput:
    """All microbatch versions of one tensor returned from an smp.step function."""

    def __init__(self, outputs):
        self.outputs = list(outputs)

    def reduce_mean(self):
        return tf.add_n(self.outputs) / tf.cast(len(self.outputs), self.outputs[0].dtype)

    def reduce_sum(self):
        return tf.add_n(self.outputs)

    def concat(self):
        return tf.concat(self.outputs, axis=0)

    def stack(self):
        return tf.stack(self.outputs)

    def merge(self):
        return tf.concat(self.outputs, axis=0)

    def accumulate(self, method="variable", var=None):
        """As the library's (smdistributed/modelparallel/tensorflow/split.py, lines 188-265): called
        eagerly, every microbatch's output already exists and is averaged (line 217-218); in a
        tf.function, "variable" (the default) assigns the first microbatch's share to one
        accumulation variable per tensor and adds the others in order (lines 236-265), so only the
        accumulator and the microbatch being added are alive ("does not wait for all tensors to
        be available before accumulating, thereby saving memory", lines 189-193); add_n and
        accumulate_n take all of them at once. Records how many microbatch outputs are alive."""
        if method not in ("add_n", "accumulate_n", "variable"):
            raise ValueError("%s: accumulate(method=%r): one of add_n, accumulate_n, variable" % (FAKE, method))
        if var is not None and not isinstance(var, tf.Variable):
            raise TypeError("%s: accumulate(var=...) takes a tf.Variable" % FAKE)
        eager = tf.executing_eagerly()
        sequential = method == "variable" and not eager and len(self.outputs) > 1
        record("smp.StepOutput.accumulate", method=method, eager=eager, microbatches=len(self.outputs),
               alive=1 if sequential else len(self.outputs))
        if not sequential:
            return self.reduce_mean()
        accumulator = var if var is not None else _accumulator(self.outputs[0])
        share = tf.cast(len(self.outputs), self.outputs[0].dtype)
        total = accumulator.assign(self.outputs[0] / share)
        for output in self.outputs[1:]:
            with tf.control_dependencies([total]):
                total = accumulator.assign_add(output / share)
        return tf.convert_to_tensor(total)


def _accumulator(tensor):
    """The accumulation variable of a step output, one per tensor name as the library keeps them
    (state_mod.py, AccumulationVariables, lines 226-245)."""
    accumulators = _state().setdefault("accumulators", {})
    if tensor.name not in accumulators:
        with tf.init_scope():
            accumulators[tensor.name] = tf.Variable(tf.zeros(tensor.shape, tensor.dtype), trainable=False,
                                                    name=tensor.name.split(":")[0].replace("/", "_") + "_accum")
    return accumulators[tensor.name]


def _is_tensor(value):
    return isinstance(value, (tf.Tensor, tf.Variable))


def _split(value, microbatches, axis, name):
    if _is_tensor(value):
        length = value.shape[axis]
        if length is None:
            raise ValueError("%s: argument %r has an unknown batch size; batch with drop_remainder=True"
                             % (FAKE, name))
        if length % microbatches:
            raise ValueError("%s: batch size %d of argument %r is not divisible by microbatches=%d"
                             % (FAKE, length, name, microbatches))
        return tf.split(value, microbatches, axis=axis)
    if hasattr(value, "smp_slice"):
        return [value.smp_slice(microbatches, index, axis) for index in range(microbatches)]
    if isinstance(value, (list, tuple, set)):
        parts = [_split(item, microbatches, axis, name) for item in value]
        return [type(value)(part[i] for part in parts) for i in range(microbatches)]
    if isinstance(value, dict):
        parts = {key: _split(item, microbatches, axis, name) for key, item in value.items()}
        return [{key: part[i] for key, part in parts.items()} for i in range(microbatches)]
    raise TypeError("%s: argument %r of type %s is neither a tensor nor a list, tuple, dict or set, has no "
                    "smp_slice and is not in non_split_inputs" % (FAKE, name, type(value).__name__))


_TF_FUNCTION_ARGUMENTS = set(inspect.signature(tf.function).parameters) - {"func"}


def step(function=None, non_split_inputs=None, input_split_axes=None, **tf_function_kwargs):
    """`@smp.step` or `@smp.step(non_split_inputs=..., input_split_axes=..., **tf.function args)`."""
    if function is None:
        return functools.partial(step, non_split_inputs=non_split_inputs, input_split_axes=input_split_axes,
                                 **tf_function_kwargs)
    unknown = sorted(set(tf_function_kwargs) - _TF_FUNCTION_ARGUMENTS)
    if unknown:
        raise TypeError("%s: smp.step got %s, which are not tf.function arguments" % (FAKE, unknown))
    for name in ("jit_compile", "experimental_compile"):
        if tf_function_kwargs.get(name):
            raise ValueError("%s: smp.step(%s=True) interferes with pipelining and partitioning; use "
                             "tf.config.optimizer.set_jit(True)" % (FAKE, name))
    signature = inspect.signature(function)
    for name in list(non_split_inputs or ()) + list(input_split_axes or {}):
        if name not in signature.parameters:
            raise ValueError("%s: %r is not an argument of %s" % (FAKE, name, function.__name__))
    non_split = set(non_split_inputs or ())
    axes = dict(input_split_axes or {})
    traced = tf.function(function, **tf_function_kwargs)
    calls_model = {}

    def checked(**values):
        _state()["model_called"] = False
        outputs = traced(**values)
        calls_model.setdefault(True, _state()["model_called"])
        return outputs

    @functools.wraps(function)
    def run(*args, **kwargs):
        _require_init("step")
        state = _state()
        several = mp_size() > 1 and state["world"] is not None
        eager = tf.executing_eagerly()
        microbatches = _config()["microbatches"]
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        per_mb = [dict() for _ in range(microbatches)]
        for name, value in bound.arguments.items():
            pieces = [value] * microbatches if name in non_split else _split(value, microbatches,
                                                                          axes.get(name, 0), name)
            for index, piece in enumerate(pieces):
                per_mb[index][name] = piece
        record("smp.step", function=function.__name__, microbatches=microbatches, rank=state["rank"], eager=eager,
               shapes={name: list(v.shape) for name, v in per_mb[0].items() if _is_tensor(v)})
        start = _step_barrier(state, eager) if several else None
        outputs = []
        state["in_step"] = True
        try:
            with tf.control_dependencies([start] if start is not None else []):
                for values in per_mb:
                    outputs.append(checked(**values))
        finally:
            state["in_step"] = False
        if not calls_model.get(True):
            raise ValueError("%s: the smp.step function %s must return a value that depends on the output of "
                             "smp.DistributedModel (it never calls the model)" % (FAKE, function.__name__))
        if not state["partitioned"]:
            state["partitioned"] = True
            for hook in state["hooks"]:
                hook()
        if several:
            end = _step_barrier(state, eager, after=[t for out in outputs for t in tf.nest.flatten(out)
                                                     if isinstance(t, tf.Tensor)])
            if end is not None:
                with tf.control_dependencies([end]):
                    outputs = [tf.nest.map_structure(lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, out)
                               for out in outputs]
        first = outputs[0]
        flat = [tf.nest.flatten(out) for out in outputs]
        wrapped = [StepOutput([f[i] for f in flat]) if _is_tensor(item) else item
                   for i, item in enumerate(tf.nest.flatten(first))]
        return tf.nest.pack_sequence_as(first, wrapped)

    return run


def _step_barrier(state, eager, after=()):
    """An mp-group barrier around a step, so no rank reads a partner's variables while the partner
    updates them (every rank of the fake computes the whole model). Eagerly: a barrier now, None.
    In a tf.function: an op that waits at run time (after the tensors `after`); it holds one
    TensorFlow inter-op thread per rank while it waits, so the process needs that many."""
    if eager:
        barrier(CommGroup.MP_GROUP)
        return None
    threads = tf.config.threading.get_inter_op_parallelism_threads() or int(
        os.environ.get("TF_NUM_INTEROP_THREADS") or os.cpu_count())
    if threads < state["world"].size:
        raise RuntimeError("%s: smp.step inside a tf.function with several partitions blocks one TensorFlow "
                           "inter-op thread per rank at its barriers: run the %d ranks with at least %d inter-op "
                           "threads (TF_NUM_INTEROP_THREADS), not %d" % (FAKE, state["world"].size,
                                                                        state["world"].size, threads))
    members = _members(CommGroup.MP_GROUP)

    def wait():
        exchange_among(state, members, tuple(members), "barrier", None, "smp.step's barrier over MP_GROUP")
        return np.int32(0)

    with tf.control_dependencies(list(after)):
        return stateful_numpy_function(wait, [], tf.int32, name="FakeSMPStepBarrier")


def stateful_numpy_function(function, inputs, dtypes, name):
    """tf.numpy_function as an op TensorFlow keeps in program order (not part of the library: the fake
    Horovod uses it too). TF 2.6's numpy_function is always stateful and has no `stateful` argument."""
    stateful = {"stateful": True} if "stateful" in inspect.signature(tf.numpy_function).parameters else {}
    return tf.numpy_function(function, inputs, dtypes, name=name, **stateful)


def register_post_partition_hook(hook):
    _require_init("register_post_partition_hook")
    _state()["hooks"].append(hook)
    return hook


_original_tape_init = tf.GradientTape.__init__


def _tape_init(self, *args, **kwargs):
    # TensorFlow's own tapes (tf.recompute_grad's backward) are not the script's.
    caller = sys._getframe(1).f_globals.get("__name__", "")
    if getattr(_local, "state", {}).get("in_step") and not caller.startswith("tensorflow"):
        raise RuntimeError("%s: tf.GradientTape is not supported inside smp.step; use Optimizer.get_gradients "
                           "(tf.gradients)" % FAKE)
    _original_tape_init(self, *args, **kwargs)


tf.GradientTape.__init__ = _tape_init


# ---- smp.partition and DistributedModel ----

class partition:  # noqa: N801 - the library's name
    """`with smp.partition(index):` places the operations (and variables) created inside on `index`."""

    def __init__(self, index):
        _require_init("partition")
        if not isinstance(index, int) or not 0 <= index < mp_size():
            raise ValueError("%s: smp.partition(%r): index must be smaller than partitions=%d"
                             % (FAKE, index, mp_size()))
        self.index = index

    def __enter__(self):
        _state()["partition_stack"].append(self.index)
        return self

    def __exit__(self, *exc_info):
        _state()["partition_stack"].pop()
        return False


def _place(next_creator, **kwargs):
    """Variable creator of the partition step: the variable exists on its owner only."""
    state, config = _state(), _config()
    index = state["created"]
    state["created"] += 1
    if not config["auto_partition"]:
        owner = state["partition_stack"][-1] if state["partition_stack"] else config["default_partition"]
    else:
        owner = index % mp_size()
    group = tuple(get_mp_group())
    world = state["world"]
    if world is None:
        if size() > 1 and mp_size() > 1:
            raise RuntimeError("%s: the partition step needs the other ranks of the mp group" % FAKE)
        variable = next_creator(**kwargs)
        state["owned"].add(id(variable))
        return variable
    with world.lock:
        if owner == mp_rank():
            # In creation order across the group, so initial values draw the same random numbers
            # as one process building the whole model.
            world.wait(lambda: (group, index - 1) in world.placed or index == 0,
                       "creating variable %d on rank %d" % (index, rank()))
            if (group, "random") not in world.placed:
                world.placed[(group, "random")] = _seed_generators()
            with _random_of(world.placed[(group, "random")]):
                variable = next_creator(**kwargs)
            world.placed[(group, index)] = variable
            world.lock.notify_all()
            state["owned"].add(id(variable))
            return variable
        world.wait(lambda: (group, index) in world.placed,
                   "rank %d waiting for variable %d from its owner" % (rank(), index))
        return world.placed[(group, index)]


def _keras_backend():
    return sys.modules[keras.backend.clear_session.__module__]


def _op_seeds():
    """TensorFlow's eager context, which draws the op seed of every random op without one (Keras' own
    unseeded initializers on TF 2.6) from a Python generator, `_rng`, once a global seed is set
    (tensorflow/python/eager/context.py, `_set_global_seed` and `internal_operation_seed`). One
    context serves every rank thread of the fake; each process of the library has its own."""
    from tensorflow.python.eager import context
    return context.context()


def _copy_of(generator):
    if generator is None:
        return None
    copy = random.Random()
    copy.setstate(generator.getstate())
    return copy


def _seed_generators():
    """The generators this thread's initial values draw their seeds from: Keras' (Keras >= 2.7 draws
    an unseeded initializer's seed from its thread's generator, or from the process's `random`
    without keras.utils.set_random_seed, which the rank threads share) and TensorFlow's op seeds
    (`_op_seeds`, shared too). Each mp group draws from its own copy of the shared ones as they are
    now (after the ranks seeded them), as each replica's processes would, instead of the groups
    taking turns on one sequence."""
    keras_generator = getattr(getattr(_keras_backend(), "_SEED_GENERATOR", None), "generator", None)
    return keras_generator or _copy_of(random), _copy_of(getattr(_op_seeds(), "_rng", None))


def _private_generators():
    """Copies of the generators `_seed_generators` would name, so drawing from them moves none."""
    keras_generator = getattr(getattr(_keras_backend(), "_SEED_GENERATOR", None), "generator", None)
    return _copy_of(keras_generator or random), _copy_of(getattr(_op_seeds(), "_rng", None))


class _random_of:  # noqa: N801
    """Draw initial values from the given (Keras, TensorFlow op seed) generators, so a partitioned
    model starts from the values one process building it would draw. The op seeds' generator is the
    process's: hold the world's lock while inside."""

    def __init__(self, generators):
        self.keras_generator, self.op_seed_generator = generators
        self.holder = getattr(_keras_backend(), "_SEED_GENERATOR", None)

    def __enter__(self):
        if self.holder is not None:
            self.saved = getattr(self.holder, "generator", None)
            self.holder.generator = self.keras_generator
        if self.op_seed_generator is not None:
            self.saved_op_seeds = _op_seeds()._rng
            _op_seeds()._rng = self.op_seed_generator

    def __exit__(self, *exc_info):
        if self.holder is not None:
            self.holder.generator = self.saved
        if self.op_seed_generator is not None:
            _op_seeds()._rng = self.saved_op_seeds
        return False


def _dummy(value):
    return tf.zeros(value.shape, value.dtype) if _is_tensor(value) else value


class _Holder:
    def __init__(self, value):
        self.value = value


def _nested_layers(model):
    return list(model._flatten_layers(include_self=False, recursive=True))


def get_layers(model):
    """The layers the library walks (v2/utils.py, `get_layers` and `_flatten_layers`, lines 14-52):
    each of `model.layers`, and below each the layers found in its `_layers` attribute, recursively
    (those that are `tf.keras.layers.Layer`s). Keras named that attribute `_self_tracked_trackables`
    from TF 2.5 on; neither Keras of TF 2.6 (nor of later TFs) has `_layers`, so the walk finds no
    sublayer: the model's own layers are all it lists. The 1.4.0 wheel of the TF 2.6 DLC was not
    read; 1.7.0 and 1.12.1, released after TF 2.5, still read `_layers`."""
    found = []
    for layer in model.layers:
        found.extend(_walk_layers(layer))
    return found


def _walk_layers(layer, seen=None):
    seen = set() if seen is None else seen
    yield layer
    for inner in tf.nest.flatten(getattr(layer, "_layers", None)):
        if id(inner) not in seen and isinstance(inner, tf.keras.layers.Layer):
            seen.add(id(inner))
            yield from _walk_layers(inner, seen)


def _builds_itself(layer):
    """The library's test for a layer with a build() of its own (v2/model.py line 252, serialization.py
    line 292): Keras marks its default build with `_is_default`."""
    return not hasattr(layer.build, "_is_default")


class DistributedModel(Model):
    """Subclass and implement `call`; calling the model is allowed only inside smp.step.

    As the library's (smdistributed/modelparallel/tensorflow/v2/model.py in the 1.12.1 source, GitHub
    tkazusa/smdistributed_modelparallel), from its base on: TensorFlow's bundled Keras Model (line 14,
    `from tensorflow.python.keras.models import Model`), not `tf.keras.Model`, which on TF 2.6 is the
    separate keras package's. On mp_rank 0, `__init__` makes the tracing copy (lines 62-64) by calling
    the model's class again with the values of its `__init__`'s parameters read from the frame three
    levels out of `_get_init_args` (lines 77-126): the frame that called `DistributedModel.__init__`.
    The first call refuses layers with their own `build()` that the model and its copy share (lines
    217-218, 249-257) and partitions: the copy's call is traced, recording the input shape each layer
    `get_layers` lists is built with (serialization.py `track_graph`, lines 132-213), and every rank
    builds those layers, with `build(shape)` and never a call (serialization.py `import_graph`, lines
    280-313): a weight that only a layer's call creates does not exist on the library's ranks, and
    the fake refuses it. A rank's model is never called through Keras there (it imports the
    partitioned graph, line 160), so `count_params()` raises. Not emulated: the SMPDummy layers the
    library adds to every model (lines 58, 556-570) and the layer names of the copy (lines 128-148).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # In a holder Keras does not track: the copy's layers are not this model's.
        self._fake_copy = _Holder(None)
        state = _state()
        if mp_rank() == 0 and not state.get("constructing_duplicate"):
            self._fake_copy = _Holder(DistributedModel._duplicate_model(self))
            record("smp.DistributedModel.tracing_copy", model=type(self).__name__, rank=state["rank"],
                   layers=[layer.name for layer in get_layers(self._fake_copy.value)])

    @staticmethod
    def _duplicate_model(model):
        """The tracing copy: `type(model)` called with the arguments its construction was given (lines
        77-95). Per rank (the library's ranks are processes), so the flag is the rank thread's."""
        args, kwargs = DistributedModel._get_init_args(model)
        state = _state()
        state["constructing_duplicate"] = True
        try:
            return type(model)(*[arg for arg in args if arg is not model], **kwargs)
        finally:
            state["constructing_duplicate"] = False

    @staticmethod
    def _get_init_args(model):
        """The values of `type(model).__init__`'s parameters, read from the frame three levels out of this
        function (this one, `_duplicate_model`, `DistributedModel.__init__`, its caller: lines 101-126). Only
        when that caller is the class's own `__init__` are they the arguments of the construction: a
        subclass without an `__init__` of its own, or one whose `super().__init__` reaches
        `DistributedModel.__init__` through another class's `__init__`, has its parameters read from
        another frame, and a parameter that frame lacks raises KeyError there (line 115)."""
        spec = inspect.getfullargspec(type(model).__init__)
        caller = sys._getframe(3)
        values = caller.f_locals
        names = list(spec.args) + ([spec.varargs] if spec.varargs else []) + list(spec.kwonlyargs) + (
            [spec.varkw] if spec.varkw else [])
        missing = [name for name in names if name not in values]
        if missing:
            raise KeyError("%s: %s.__init__'s parameters %s are not variables of %s(), the function that called "
                           "DistributedModel.__init__, where the library reads them to re-create the model"
                           % (FAKE, type(model).__name__, missing, caller.f_code.co_name))
        args = [values[name] for name in spec.args] + (list(values[spec.varargs]) if spec.varargs else [])
        kwargs = {name: values[name] for name in spec.kwonlyargs}
        kwargs.update(values[spec.varkw] if spec.varkw else {})
        return args, kwargs

    def _refuse_shared_layers(self):
        shared = [layer.name for layer, copied in zip(get_layers(self), get_layers(self._fake_copy.value))
                  if layer is copied and _builds_itself(layer)]
        if shared:
            raise ValueError("Layers that have a build() method implemented must be created in the __init__ methods "
                             "of an enclosing Layer or a smp.DistributedModel object. The following layers are found "
                             "to be in violation of this: %s. (%s)" % (shared, FAKE))

    def _trace_copy(self, args, kwargs):
        """[(input shape, partition) or None] per layer of `get_layers(copy)`: the shape each layer's
        build() got in the copy's call, and the partition it was built in (the `smp.partition` index
        around it, or default_partition); None for a layer the call never built."""
        copy = self._fake_copy.value
        plan, layers = [], get_layers(copy)
        state, config = _state(), _config()

        def recording(layer, build):
            def wrapper(input_shape):
                partition = state["partition_stack"][-1] if state["partition_stack"] else config["default_partition"]
                plan[layers.index(layer)] = (tf.TensorShape(input_shape).as_list(), partition)
                return build(input_shape)
            return wrapper

        plan.extend([None] * len(layers))
        for layer in layers:
            layer.build = recording(layer, layer.build)
        try:
            # The copy's initial values from generators of its own: in the library each rank is a
            # process with its random state, where the copies of all replicas draw alike; the fake's
            # rank threads would otherwise race for the process's (and move the model's draws).
            world = state["world"]
            with world.lock if world is not None else contextlib.nullcontext(), _random_of(_private_generators()):
                Model.__call__(copy, *args, **kwargs)
        finally:
            for layer in layers:
                del layer.build
        return plan

    def _build_layers(self, plan):
        """Every layer of `get_layers(self)` the copy's call built, built as the library's ranks do, by
        its build() with the traced shape and under its name (each variable on its owner: `_place`)."""
        state = _state()
        for layer, entry in zip(get_layers(self), plan):
            if entry is None or not _builds_itself(layer) or layer.built:
                continue
            shape, partition = entry
            state["partition_stack"].append(partition)
            try:
                with tf.variable_creator_scope(_place), tf.name_scope(layer.name):
                    layer.build(tf.TensorShape(shape))
            finally:
                state["partition_stack"].pop()

    def _partition(self, args, kwargs):
        """The first call: refuse shared layers and trace the copy (mp_rank 0), send the layers' shapes to
        the mp group (the library broadcasts its serialized graph, line 226), build the layers; then the
        whole call once more, in which no variable may be created (every rank of the fake computes the
        whole model, reading its partners' variables)."""
        plan = None
        if self._fake_copy.value is not None:
            self._refuse_shared_layers()
            plan = self._trace_copy(args, kwargs)
        if mp_size() > 1:
            plan = _exchange("allgather", CommGroup.MP_GROUP, plan)[0]
        self._build_layers(plan)
        with tf.variable_creator_scope(_created_in_a_call):
            Model.__call__(self, *args, **kwargs)
        self._fake_partitioned = True
        self._forget_other_ranks_weights()
        record("smp.DistributedModel.partition", model=type(self).__name__, rank=_state()["rank"],
               layers=[layer.name for layer in get_layers(self)],
               built=[layer.name for layer, entry in zip(get_layers(self), plan) if entry is not None])

    def _forget_other_ranks_weights(self):
        """A rank of the library builds only the layers placed on it (v2/serialization.py, lines
        280-313): here every layer's weight lists drop what other ranks hold, so no layer of this
        rank's model lists them (the fake's compute still reads them through the layers' attributes)."""
        owned = _state()["owned"]
        for layer in _nested_layers(self):
            for listed in (layer._trainable_weights, layer._non_trainable_weights):
                listed[:] = [weight for weight in listed if id(getattr(weight, "_variable", weight)) in owned]

    def count_params(self):
        raise ValueError("%s: count_params() of %s: a rank builds only the layers of its partition, and the model is "
                         "never built through Keras (it imports the partitioned graph)" % (FAKE, self.name))

    def __call__(self, *args, **kwargs):
        state = _state()
        if not state["in_step"]:
            raise RuntimeError("%s: a DistributedModel is called outside smp.step" % FAKE)
        state["model_called"] = True
        if not getattr(self, "_fake_partitioned", False):
            with tf.init_scope():
                self._partition(tf.nest.map_structure(_dummy, args), tf.nest.map_structure(_dummy, kwargs))
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        known = len(graph.get_operations()) if graph is not None else 0
        outputs = super().__call__(*args, **kwargs)
        if graph is not None and mp_rank() != 0:
            _refuse_custom_gradients(graph.get_operations()[known:])
        flat = [t for t in tf.nest.flatten(outputs) if _is_tensor(t)]
        record("smp.DistributedModel.output", model=type(self).__name__, rank=state["rank"],
               shapes=[list(t.shape) for t in flat],
               bytes=sum(t.shape.num_elements() * t.dtype.size for t in flat))
        return outputs

    def _local(self, variables):
        owned = _state()["owned"]
        # Keras wraps a mixed-precision variable in an AutoCastVariable around the created one.
        return [v for v in variables if id(getattr(v, "_variable", v)) in owned]

    @property
    def weights(self):
        return self._local(super().weights)

    @property
    def trainable_weights(self):
        return self._local(super().trainable_weights)

    @property
    def non_trainable_weights(self):
        return self._local(super().non_trainable_weights)

    def save_model(self, save_path="/opt/ml/model"):
        raise NotImplementedError("%s: save_model (a SavedModel of the unpartitioned model) is not emulated"
                                  % FAKE)


def _created_in_a_call(next_creator, **kwargs):
    raise RuntimeError("%s: variable %r is created in a layer's call: a rank of the library builds only the layers "
                       "get_layers lists, with their build() and the traced input shape, and never calls them "
                       "(v2/serialization.py, lines 280-313). On TF >= 2.5 those are the model's own layers only "
                       "(Keras has no `_layers`, v2/utils.py): a sublayer must be built by its parent's build()"
                       % (FAKE, kwargs.get("name")))


def _refuse_custom_gradients(operations):
    """Ranks other than mp_rank 0 import the graph rank 0 traced (v2/model.py lines 228-235,
    v2/serialization.py `import_graph`, tf.graph_util.import_graph_def): a gradient registered
    in rank 0's process only (tf.custom_gradient, tf.recompute_grad) is not in theirs, and the
    backward pass fails there (tests/smdist/test_smp_recompute.py shows it with TensorFlow alone)."""
    for operation in operations:
        try:
            custom = operation.get_attr("_gradient_op_type")
        except ValueError:
            continue
        raise LookupError("No gradient defined for operation '%s' (op type: %s): its gradient %s exists only in the "
                          "process that traced the model (%s: a rank with mp_rank > 0 imports the graph)"
                          % (operation.name, operation.type, custom.decode() if isinstance(custom, bytes) else custom,
                             FAKE))


class CheckpointManager:
    """smp.CheckpointManager(checkpoint, directory="/opt/ml/checkpoints", max_to_keep=None, checkpoint_name="ckpt").

    "TensorFlow API", smp.CheckpointManager: `checkpoint` a tf.train.Checkpoint; `directory` where
    checkpoints are written; `max_to_keep` how many to keep (None: all); `checkpoint_name` the
    files' name. Methods: `save()` "saves a new checkpoint in the specified directory", `restore()`
    "restores the latest checkpoint in the specified directory"; restores happen after the first
    step (the developer guide; here: before the model is partitioned, restore raises). Nothing
    else the page lists exists here (no save or restore arguments, no latest_checkpoint).

    Each rank saves only its own variables: those of the checkpoint's object graph that are not
    placed on another rank (a partition's variables exist on its rank only). The files are the
    fake's own layout, `<directory>/fake-partition-<mp_rank>/` (the library's:
    `<directory>/mp_rank_<pp_rank>/`, v2/checkpoint.py line 19): pickles and a "checkpoint" state
    file naming the latest; a caller must not read them. `save()` returns the saved path, as
    TensorFlow's CheckpointManager does. `restore()` reads every partition's directory, as the
    library's does (see the method).
    """

    STATE_FILE = "checkpoint"

    def __init__(self, checkpoint, directory="/opt/ml/checkpoints", max_to_keep=None, checkpoint_name="ckpt"):
        _require_init("CheckpointManager")
        if not isinstance(checkpoint, tf.train.Checkpoint):
            raise TypeError("%s: smp.CheckpointManager(checkpoint) takes a tf.train.Checkpoint, got %s"
                            % (FAKE, type(checkpoint).__name__))
        if not isinstance(directory, str) or not isinstance(checkpoint_name, str):
            raise TypeError("%s: smp.CheckpointManager directory and checkpoint_name are str" % FAKE)
        if max_to_keep is not None and (not isinstance(max_to_keep, int) or isinstance(max_to_keep, bool)
                                        or max_to_keep < 1):
            raise ValueError("%s: smp.CheckpointManager max_to_keep=%r: a positive int or None" % (FAKE, max_to_keep))
        self._checkpoint, self._directory = checkpoint, directory
        self._max_to_keep, self._name = max_to_keep, checkpoint_name

    def _partition_directory(self, partition=None):
        return os.path.join(self._directory, "fake-partition-%d" % (mp_rank() if partition is None else partition))

    def _saved(self, directory=None):
        """The checkpoint files of a partition directory (this rank's by default), oldest first."""
        state_path = os.path.join(directory or self._partition_directory(), self.STATE_FILE)
        if not os.path.exists(state_path):
            return []
        with open(state_path) as handle:
            return [line.split('"')[1] for line in handle if line.startswith("all_model_checkpoint_paths")]

    def _own_variables(self):
        """(path, variable) of this rank's variables in the checkpoint's object graph, in path order."""
        elsewhere = _placed_on_other_ranks()
        found, queue, seen = [], [("", self._checkpoint)], set()
        while queue:
            path, node = queue.pop(0)
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, tf.Variable):
                if id(getattr(node, "_variable", node)) not in elsewhere:
                    found.append((path, node))
                continue
            for name, child in sorted(_checkpoint_children(node).items()):
                queue.append(("%s/%s" % (path, name) if path else name, child))
        return found

    def save(self):
        _require_init("CheckpointManager.save")
        own = self._own_variables()
        saved = self._saved()
        number = int(saved[-1].rsplit("-", 1)[1].split(".")[0]) + 1 if saved else 1
        name = "%s-%d.pickle" % (self._name, number)
        os.makedirs(self._partition_directory(), exist_ok=True)
        payload = {"paths": [path for path, _ in own], "values": [variable.numpy() for _, variable in own]}
        with open(os.path.join(self._partition_directory(), name + ".tmp"), "wb") as handle:
            pickle.dump(payload, handle, protocol=4)
        os.replace(os.path.join(self._partition_directory(), name + ".tmp"),
                   os.path.join(self._partition_directory(), name))
        saved.append(name)
        if self._max_to_keep is not None:
            for old in saved[:-self._max_to_keep]:
                if os.path.exists(os.path.join(self._partition_directory(), old)):  # as TensorFlow's sweep
                    os.remove(os.path.join(self._partition_directory(), old))
            saved = saved[-self._max_to_keep:]
        state_path = os.path.join(self._partition_directory(), self.STATE_FILE)
        with open(state_path + ".tmp", "w") as handle:
            handle.write('model_checkpoint_path: "%s"\n' % saved[-1])
            handle.writelines('all_model_checkpoint_paths: "%s"\n' % old for old in saved)
        os.replace(state_path + ".tmp", state_path)
        record("smp.CheckpointManager.save", rank=rank(), directory=self._directory, variables=len(own))
        # As TensorFlow's CheckpointManager.save, which the library's inherits: the path of the save.
        return os.path.join(self._partition_directory(), name.rsplit(".", 1)[0])

    def restore(self):
        """As the library's `_restore` (v2/checkpoint.py, lines 41-77): every partition directory
        under the manager's directory, each one's latest file restored into the checkpoint object
        (partially: only paths this rank's object has); a directory whose file is missing is skipped
        with the warning "No checkpoints restored." and nothing else, so a partition without its
        file keeps the values it has."""
        _require_init("CheckpointManager.restore")
        if not _state()["partitioned"]:
            raise RuntimeError("%s: restore with smp.CheckpointManager after the first smp.step (the model is not "
                               "partitioned yet)" % FAKE)
        own = dict(self._own_variables())
        directories = sorted(os.path.join(self._directory, name) for name in os.listdir(self._directory)
                             if os.path.isdir(os.path.join(self._directory, name))) \
            if os.path.isdir(self._directory) else []
        restored, assigned = [], 0
        for directory in directories:
            saved = self._saved(directory)
            path = os.path.join(directory, saved[-1]) if saved else None
            if path is None or not os.path.exists(path):
                sys.stderr.write("%s: WARNING No checkpoints restored. (%s)\n" % (FAKE, directory))
                continue
            with open(path, "rb") as handle:
                payload = pickle.load(handle)
            for name, value in zip(payload["paths"], payload["values"]):
                if name not in own:
                    continue
                if tuple(own[name].shape) != value.shape:
                    raise ValueError("%s: %s: %s has shape %s, the checkpoint holds %s"
                                     % (FAKE, path, name, tuple(own[name].shape), value.shape))
                own[name].assign(value)
                assigned += 1
            restored.append(os.path.relpath(path, self._directory))
        record("smp.CheckpointManager.restore", rank=rank(), directory=self._directory, restored=restored,
               assigned=assigned)


def _checkpoint_children(node):
    """{name: object} a trackable saves in a checkpoint: tf.train.TrackableView's children; TF 2.6 has
    no TrackableView, and lists them as the trackable's `_checkpoint_dependencies`."""
    if hasattr(tf.train, "TrackableView"):
        return tf.train.TrackableView(node).children(node)
    return {reference.name: reference.ref for reference in node._checkpoint_dependencies}


def _placed_on_other_ranks():
    """ids of the partitioned variables this rank does not hold."""
    state = _state()
    world = state["world"]
    if world is None:
        return set()
    with world.lock:
        placed = [value for key, value in world.placed.items() if key[1] != "random"]
    return {id(variable) for variable in placed} - state["owned"]
