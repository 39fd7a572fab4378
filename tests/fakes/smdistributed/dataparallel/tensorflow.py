"""FAKE `smdistributed.dataparallel.tensorflow` (SMDDP) for tests: not AWS's library.

Written from the library's TensorFlow API documentation, "TensorFlow Guide to SageMaker's
distributed data parallel library" (SageMaker Python SDK v2,
https://sagemaker.readthedocs.io/en/stable/api/training/sdp_versions/latest/smd_data_parallel_tensorflow.html,
source doc/api/training/sdp_versions/latest/smd_data_parallel_tensorflow.rst), and the SDK's
pull request #2346 ("Update smdp docs with sparse_as_dense support": `sparse_as_dense`
converts `tf.IndexedSlices` gradients to tensors). Each call below cites what it follows.

Ranks are processes: `FAKE_SDP_RANK`, `FAKE_SDP_SIZE`, `FAKE_SDP_LOCAL_RANK`,
`FAKE_SDP_LOCAL_SIZE` say which, and collectives meet the other ranks' in the directory
`FAKE_SDP_RENDEZVOUS` (`_rendezvous.py`) and reduce their real values. One rank needs no
directory; more ranks without one raise at the first collective. Every rank checks that all
ranks made the same call with the same shapes and dtypes ("The shape of the input must be
identical across all ranks").

Strict where the documentation is: only the documented calls and arguments exist; values it
does not list raise. Left out (lmstack does not use them, and they are TF1/estimator APIs or
XLA-only): `broadcast_global_variables`, `DistributedOptimizer`, `BroadcastGlobalVariablesHook`,
`overlap`. The documentation says nothing about how `DistributedGradientTape` reduces a
`tf.IndexedSlices` gradient without `sparse_as_dense`, so the fake returns such a gradient
exactly as the wrapped tape gave it, not reduced; `allreduce` takes only a `tf.Tensor`.
Calls are recorded (`smdistributed.calls`, FAKE_SMDIST_LOG).
"""
import enum
import os
import weakref

import numpy as np

from lm.compat import tf
from smdistributed import env_int, record
from smdistributed.dataparallel._rendezvous import DirectoryRendezvous

_state = {"initialized": False, "rank": 0, "size": 1, "local_rank": 0, "local_size": 1, "rendezvous": None}


class Compression(enum.Enum):
    """`none` (NoneCompression) and `fp16` (FP16Compression: floating-point tensors travel as float16)."""

    none = "none"
    fp16 = "fp16"


class ReduceOp(enum.Enum):
    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


class NotSupportedError(ValueError):
    """What the documentation says `device_dense` and `device_sparse` raise ("Not supported")."""


def _require_init(name):
    if not _state["initialized"]:
        raise RuntimeError("fake smdistributed.dataparallel: %s() before init()" % name)


def init():
    """init(): "needs to be called only once. It will throw an error if called more than once"."""
    if _state["initialized"]:
        raise RuntimeError("init() called more than once. smdistributed.dataparallel is already initialized.")
    size = env_int("FAKE_SDP_SIZE", 1)
    rank = env_int("FAKE_SDP_RANK", 0)
    local_size = env_int("FAKE_SDP_LOCAL_SIZE", size)
    local_rank = env_int("FAKE_SDP_LOCAL_RANK", rank % local_size)
    if not (0 <= rank < size and 0 <= local_rank < local_size <= size and size % local_size == 0):
        raise ValueError("fake smdistributed.dataparallel: rank %d of %d, local rank %d of %d is not a valid layout"
                         % (rank, size, local_rank, local_size))
    directory = os.environ.get("FAKE_SDP_RENDEZVOUS") or None
    _state.update(initialized=True, rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                  rendezvous=DirectoryRendezvous(directory, rank, size) if directory or size == 1 else None)
    record("sdp.init")


def size():
    """size(): the number of GPUs across all nodes."""
    _require_init("size")
    return _state["size"]


def local_size():
    _require_init("local_size")
    return _state["local_size"]


def rank():
    _require_init("rank")
    return _state["rank"]


def local_rank():
    _require_init("local_rank")
    return _state["local_rank"]


def shutdown():
    """shutdown(): "Optional to call at the end of the training script"."""
    _require_init("shutdown")
    record("sdp.shutdown")
    _state["initialized"] = False


# ---- collectives ----

def _check_enum(value, enum_type, argument, allowed):
    if value not in allowed:
        raise ValueError("fake smdistributed.dataparallel: %s=%r; the documentation lists %s"
                         % (argument, value, ", ".join("%s.%s" % (enum_type.__name__, item.name) for item in allowed)))
    return value


def _check_root(root_rank):
    if not isinstance(root_rank, int) or isinstance(root_rank, bool) or not 0 <= root_rank < _state["size"]:
        raise ValueError("fake smdistributed.dataparallel: root_rank=%r; an int rank from 0 to %d"
                         % (root_rank, _state["size"] - 1))


def _check_tensor(tensor, call):
    if not isinstance(tensor, tf.Tensor):
        raise TypeError("fake smdistributed.dataparallel: %s takes a tf.Tensor (the documented type), got %s"
                        % (call, type(tensor).__name__))


def _exchange(call, arrays):
    """Every rank's arrays for this collective, after checking all ranks made the same call."""
    rendezvous = _state["rendezvous"]
    if rendezvous is None:
        raise RuntimeError("fake smdistributed.dataparallel: a collective over %d ranks needs FAKE_SDP_RENDEZVOUS, "
                           "a directory every rank's process shares" % _state["size"])
    signature = (call, [(array.shape, str(array.dtype)) for array in arrays])
    gathered = rendezvous.exchange({"signature": signature, "arrays": arrays}, what=call)
    for other, contribution in enumerate(gathered):
        if contribution["signature"] != signature:
            raise RuntimeError("fake smdistributed.dataparallel: ranks disagree on a collective: rank %d called %r, "
                               "rank %d called %r (same call, shapes and dtypes on every rank required)"
                               % (_state["rank"], signature, other, contribution["signature"]))
    return [contribution["arrays"] for contribution in gathered]


def _collective(call, tensors, combine):
    """Run `combine(arrays of every rank) -> this rank's result arrays` over `tensors`, eagerly or
    as one stateful op inside a tf.function (which keeps collectives in program order)."""
    def run(*arrays):
        return [np.asarray(result, dtype=array.dtype)
                for result, array in zip(combine(_exchange(call, list(arrays))), arrays)]

    if not tensors:
        return []
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(result) for result in run(*[tensor.numpy() for tensor in tensors])]
    results = tf.numpy_function(run, list(tensors), [tensor.dtype for tensor in tensors], stateful=True)
    for result, tensor in zip(results, tensors):
        result.set_shape(tensor.shape)
    return list(results)


def _reduce(values, op, compression):
    """The reduction of one tensor's values from every rank; fp16 compression reduces in float16."""
    dtype = values[0].dtype
    if compression is Compression.fp16 and np.issubdtype(dtype, np.floating):
        values = [value.astype(np.float16) for value in values]
    stacked = np.stack(values)
    if op is ReduceOp.SUM:
        reduced = stacked.sum(axis=0, dtype=stacked.dtype)
    elif op is ReduceOp.MIN:
        reduced = stacked.min(axis=0)
    elif op is ReduceOp.MAX:
        reduced = stacked.max(axis=0)
    else:
        reduced = stacked.sum(axis=0, dtype=stacked.dtype) / len(values)
    return np.asarray(reduced).astype(dtype)


def _reduce_all(per_rank, op, compression):
    return [_reduce([arrays[index] for arrays in per_rank], op, compression) for index in range(len(per_rank[0]))]


def allreduce(tensor, param_index, num_params, compression=Compression.none, op=ReduceOp.AVERAGE):
    """allreduce(tensor, param_index, num_params, compression=Compression.none, op=ReduceOp.AVERAGE):
    tensor a tf.Tensor; param_index "0 if you are reducing a single tensor"; num_params
    "len(tensor)"; compression none or fp16; op SUM, MIN, MAX or AVERAGE ("Defaults to Average if
    None is given"). Returns a tensor of the same shape and type, reduced across all processes."""
    _require_init("allreduce")
    _check_tensor(tensor, "allreduce")
    for name, value in (("param_index", param_index), ("num_params", num_params)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError("fake smdistributed.dataparallel: allreduce %s=%r; an int" % (name, value))
    if not 0 <= param_index < num_params:
        raise ValueError("fake smdistributed.dataparallel: allreduce param_index=%d, num_params=%d; "
                         "param_index from 0 to num_params - 1" % (param_index, num_params))
    compression = _check_enum(compression, Compression, "compression", list(Compression))
    op = _check_enum(ReduceOp.AVERAGE if op is None else op, ReduceOp, "op", list(ReduceOp))
    if _tape_gradients.get(id(tensor)) is not tensor:
        # The page: allreduce is for gradients; any other tensor goes through oob_allreduce, or
        # "the job might stall or stop". The fake knows a gradient as its tape's output only.
        raise ValueError("fake smdistributed.dataparallel: allreduce of %s, which did not come out of "
                         "DistributedGradientTape.gradient: allreduce is for gradients only; use oob_allreduce "
                         "for any other tensor (the job might stall or stop)" % getattr(tensor, "name", "a tensor"))
    record("sdp.allreduce", param_index=param_index, num_params=num_params, op=op.name)
    call = "allreduce(param_index=%d, num_params=%d, op=%s, compression=%s)" % (
        param_index, num_params, op.name, compression.name)
    return _collective(call, [tensor], lambda per_rank: _reduce_all(per_rank, op, compression))[0]


def oob_allreduce(tensor, compression=Compression.none, op=ReduceOp.AVERAGE):
    """oob_allreduce(tensor, compression=Compression.none, op=ReduceOp.AVERAGE): op AVERAGE only.
    The page's "Returns: None" contradicts its own description (it averages a tensor, for a
    total loss); the fake returns the average."""
    _require_init("oob_allreduce")
    _check_tensor(tensor, "oob_allreduce")
    compression = _check_enum(compression, Compression, "compression", list(Compression))
    op = _check_enum(ReduceOp.AVERAGE if op is None else op, ReduceOp, "op", [ReduceOp.AVERAGE])
    record("sdp.oob_allreduce")
    call = "oob_allreduce(compression=%s)" % compression.name
    return _collective(call, [tensor], lambda per_rank: _reduce_all(per_rank, op, compression))[0]


def broadcast(tensor, root_rank):
    """broadcast(tensor, root_rank): the tensor with root_rank's value on every rank."""
    _require_init("broadcast")
    _check_tensor(tensor, "broadcast")
    _check_root(root_rank)
    record("sdp.broadcast", root_rank=root_rank)
    return _collective("broadcast(root_rank=%d)" % root_rank, [tensor], lambda per_rank: per_rank[root_rank])[0]


def broadcast_variables(variables, root_rank):
    """broadcast_variables(variables, root_rank): assigns root_rank's values to these tf.Variables
    on every rank ("model.variables and optimizer.variables post initialization"). Returns None."""
    _require_init("broadcast_variables")
    _check_root(root_rank)
    variables = list(variables)
    for variable in variables:
        if not isinstance(variable, tf.Variable):
            raise TypeError("fake smdistributed.dataparallel: broadcast_variables takes tf.Variable objects, got %s"
                            % type(variable).__name__)
    record("sdp.broadcast_variables", root_rank=root_rank, count=len(variables),
           names=sorted(variable.name for variable in variables))
    values = _collective("broadcast_variables(%d variables, root_rank=%d)" % (len(variables), root_rank),
                         [variable.read_value() for variable in variables], lambda per_rank: per_rank[root_rank])
    for variable, value in zip(variables, values):
        variable.assign(value)


_NOT_GIVEN = object()
# The gradients DistributedGradientTape returned (while they exist): what `allreduce` accepts.
_tape_gradients = weakref.WeakValueDictionary()


def mark_as_gradient(tensor):
    """Test helper (not part of the library): `tensor`, accepted by `allreduce` as a gradient, so a
    test can check the reduction on values it chooses."""
    _tape_gradients[id(tensor)] = tensor
    return tensor


class DistributedGradientTape:
    """DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op):
    "uses TensorFlow's GradientTape under the hood, using an AllReduce to combine gradient values".
    device_dense, device_sparse: "Not supported. Raises not supported error." compression: none or
    fp16. sparse_as_dense: "Treats sparse gradient tensor as dense tensor. Defaults to False."
    op: AVERAGE only ("Supported ops: AVERAGE")."""

    def __init__(self, gradtape, device_dense=_NOT_GIVEN, device_sparse=_NOT_GIVEN, compression=Compression.none,
                 sparse_as_dense=False, op=ReduceOp.AVERAGE):
        _require_init("DistributedGradientTape")
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError("fake smdistributed.dataparallel: DistributedGradientTape wraps a tf.GradientTape, got %s"
                            % type(gradtape).__name__)
        for name, value in (("device_dense", device_dense), ("device_sparse", device_sparse)):
            if value is not _NOT_GIVEN:
                raise NotSupportedError("DistributedGradientTape: %s is not supported by smdistributed.dataparallel"
                                        % name)
        if not isinstance(sparse_as_dense, bool):
            raise TypeError("fake smdistributed.dataparallel: sparse_as_dense=%r; True or False" % (sparse_as_dense,))
        self._tape = gradtape
        self._compression = _check_enum(compression, Compression, "compression", list(Compression))
        self._op = _check_enum(ReduceOp.AVERAGE if op is None else op, ReduceOp, "op", [ReduceOp.AVERAGE])
        self._sparse_as_dense = sparse_as_dense
        record("sdp.DistributedGradientTape", sparse_as_dense=sparse_as_dense)

    def gradient(self, target, sources, output_gradients=None):
        """The wrapped tape's gradients, each dense one averaged over all ranks (in one exchange,
        like the library's fusion buffer). With sparse_as_dense, IndexedSlices become tensors
        first; without, they come back as the tape gave them."""
        grads = tf.nest.flatten(self._tape.gradient(target, sources, output_gradients=output_gradients))
        if self._sparse_as_dense:
            grads = [tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad for grad in grads]
        dense = [index for index, grad in enumerate(grads) if isinstance(grad, tf.Tensor)]
        record("sdp.DistributedGradientTape.gradient", count=len(grads), reduced=len(dense),
               indexed_slices=sum(isinstance(grad, tf.IndexedSlices) for grad in grads))
        call = "DistributedGradientTape.gradient(%d gradients, compression=%s)" % (len(dense), self._compression.name)
        reduced = _collective(call, [grads[index] for index in dense],
                              lambda per_rank: _reduce_all(per_rank, self._op, self._compression))
        for index, value in zip(dense, reduced):
            grads[index] = value
        for grad in grads:
            if isinstance(grad, tf.Tensor):
                _tape_gradients[id(grad)] = grad
        return tf.nest.pack_sequence_as(sources, grads)
