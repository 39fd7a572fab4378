"""FAKE `smdistributed.dataparallel.tensorflow` (SMDDP) for tests: not AWS's library.

Implements the documented TF API subset lmstack uses (SageMaker Python SDK v2,
doc/api/training/sdp_versions/latest/smd_data_parallel_tensorflow.rst): init, size,
local_size, rank, local_rank, allreduce, broadcast_variables, shutdown, DistributedGradientTape, Compression, ReduceOp. Ranks come from FAKE_SDP_*;
collectives act as if every peer held this process's values (see tests/fakes/README.md).
"""
import enum

from lm.compat import tf
from smdistributed import env_int, record

_state = {"initialized": False}


class Compression(enum.Enum):
    none = "none"
    fp16 = "fp16"


class ReduceOp(enum.Enum):
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    AVERAGE = "average"


def _require_init(name):
    if not _state["initialized"]:
        raise RuntimeError("fake smdistributed.dataparallel: %s() before init()" % name)


def init():
    if _state["initialized"]:
        # The documented error text.
        raise RuntimeError("init() called more than once. smdistributed.dataparallel is already initialized.")
    _state["initialized"] = True
    record("sdp.init")


def size():
    _require_init("size")
    return env_int("FAKE_SDP_SIZE", 1)


def local_size():
    _require_init("local_size")
    return env_int("FAKE_SDP_LOCAL_SIZE", size())


def rank():
    _require_init("rank")
    return env_int("FAKE_SDP_RANK", 0)


def local_rank():
    _require_init("local_rank")
    return env_int("FAKE_SDP_LOCAL_RANK", rank() % local_size())


def _reduce(tensor, op):
    if op in (ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, None):
        return tf.identity(tensor)
    return tensor * tf.cast(size(), tensor.dtype)


def allreduce(tensor, param_index, num_params, compression=Compression.none, op=ReduceOp.AVERAGE):
    _require_init("allreduce")
    record("sdp.allreduce", param_index=param_index, num_params=num_params, op=getattr(op, "name", op))
    return _reduce(tf.convert_to_tensor(tensor), op)


def broadcast_variables(variables, root_rank):
    _require_init("broadcast_variables")
    variables = list(variables)
    record("sdp.broadcast_variables", root_rank=root_rank, count=len(variables),
           names=sorted(v.name for v in variables))


def shutdown():
    _require_init("shutdown")
    record("sdp.shutdown")
    _state["initialized"] = False


class DistributedGradientTape(object):
    """Wraps a `tf.GradientTape`; `gradient` all-reduces (averages) each gradient."""

    def __init__(self, gradtape, compression=Compression.none, op=ReduceOp.AVERAGE):
        _require_init("DistributedGradientTape")
        self._tape = gradtape
        self._op = op
        record("sdp.DistributedGradientTape")

    def gradient(self, target, sources, output_gradients=None):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients)
        record("sdp.DistributedGradientTape.gradient", count=len(grads))
        return [None if g is None else allreduce(g, i, len(grads), op=self._op) for i, g in enumerate(grads)]
