"""FAKE `horovod.tensorflow` for the FAKE SMP's thread ranks: neither Horovod nor AWS's library.

SMP v1 with `"horovod": true` (SageMaker Python SDK, doc/api/training/smd_model_parallel_general.rst,
"TensorFlow-specific Parameters": horovod "Must be set to True if hybrid model/data parallelism is
used and the data parallelism (DP) framework is Horovod"; "Ranking Basics": `dp_group`s are "sets
of processes that all hold the same model partition, and perform data parallelism among each
other", whose allreduce "does not take place *across* dp_groups") averages gradients across model
replicas with Horovod, which smp.init() initializes (the SMP fake's premise, as the runtime's): on
each rank, Horovod spans its data-parallel group (`smp.get_dp_group()`), `hvd.rank() ==
smp.dp_rank()` and `hvd.size() == smp.dp_size()`.

The real Horovod of the process cannot be shared by the threads of `smp.run_ranks`, so run_ranks
installs this stand-in as `horovod.tensorflow` (under a parent `horovod` holding only it) in
`sys.modules` for its duration and restores what was there afterwards; one process without
run_ranks keeps the real Horovod. Each call dispatches on the calling rank thread's state and
exchanges real values with the other members of its data-parallel group through the SMP fake's
collective machinery (a peer that does not come raises FakeHang after FAKE_SMP_TIMEOUT seconds).

Only what the SMP runtime uses exists, with the semantics of Horovod's API documentation
(horovod.tensorflow): `rank()`, `size()`, `allreduce(tensor, op=None, name=None)` (op Average, the
default, or Sum; a dense tf.Tensor / tf.Variable; the result has its dtype and shape; eagerly or
inside a tf.function), `broadcast_variables(variables, root_rank)` (eagerly: assigns the root's
values to every member's variables), `Average`, `Sum`. `hvd.init()` raises (smp.init() did it),
and so does any other name or argument (process_set, compression, prescale_factor, IndexedSlices,
which real Horovod allgathers: the runtime passes dense gradients).

Inside a tf.function the allreduce is a `tf.numpy_function` that blocks one TensorFlow inter-op
thread until its group arrives; the allreduces of one graph run in the order they were traced (as
Horovod matches them by name), so a job needs at least as many inter-op threads as ranks (else it
raises, naming TF_NUM_INTEROP_THREADS, instead of hanging).
"""
import contextlib
import os
import sys
import types

import numpy as np

from lm.compat import tf
from smdistributed import record
from smdistributed.modelparallel import tensorflow as smp

FAKE = "fake horovod under SMP"
PUBLIC = ("init", "rank", "size", "allreduce", "broadcast_variables", "Average", "Sum")


class ReduceOp:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "hvd.%s" % self.name


Average, Sum = ReduceOp("Average"), ReduceOp("Sum")


def _ready(call):
    """The calling rank thread's SMP state, once smp.init() initialized Horovod on it."""
    state = smp._state()
    if state["world"] is None:
        raise RuntimeError("%s: hvd.%s outside smp.run_ranks" % (FAKE, call))
    if not state["initialized"]:
        raise RuntimeError("%s: hvd.%s before smp.init() (smp.init() initializes Horovod)" % (FAKE, call))
    if not state.get("horovod"):
        raise RuntimeError("%s: hvd.%s, but mp_parameters.horovod is false: SMP did not initialize Horovod"
                           % (FAKE, call))
    return state


def _refuse(call, others):
    if others:
        raise TypeError("%s: hvd.%s(%s) is not emulated (only the arguments the SMP runtime passes are)"
                        % (FAKE, call, ", ".join(sorted(others))))


def _channel():
    """This rank's data-parallel group and the exchange channel of its Horovod calls."""
    members = smp.get_dp_group()
    return members, ("horovod",) + tuple(members)


def init(*args, **kwargs):
    raise RuntimeError("%s: hvd.init() from the script: with mp_parameters.horovod true, smp.init() "
                       "initializes Horovod and a script must never call hvd.init()" % FAKE)


def rank():
    _ready("rank")
    return smp.dp_rank()


def size():
    _ready("size")
    return smp.dp_size()


def _inter_op_threads():
    configured = tf.config.threading.get_inter_op_parallelism_threads()
    if configured > 0:
        return configured
    if os.environ.get("TF_NUM_INTEROP_THREADS"):
        return int(os.environ["TF_NUM_INTEROP_THREADS"])
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@tf.autograph.experimental.do_not_convert
def allreduce(tensor, op=None, name=None, **others):
    """Horovod's allreduce over this rank's data-parallel group: Average (default) or Sum."""
    _refuse("allreduce", others)
    state = _ready("allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        raise NotImplementedError("%s: hvd.allreduce of tf.IndexedSlices (real Horovod allgathers values and "
                                  "indices) is not emulated; pass a dense tensor" % FAKE)
    if not isinstance(tensor, (tf.Tensor, tf.Variable)):
        raise TypeError("%s: hvd.allreduce takes a tf.Tensor or tf.Variable, got %s" % (FAKE, type(tensor).__name__))
    op = Average if op is None else op
    if op not in (Average, Sum):
        raise ValueError("%s: hvd.allreduce(op=%r): only hvd.Average and hvd.Sum are emulated" % (FAKE, op))
    dtype, shape = tensor.dtype, tensor.shape
    if op is Average and not dtype.is_floating:
        raise TypeError("%s: hvd.allreduce(op=Average) of a %s tensor" % (FAKE, dtype.name))
    members, key = _channel()
    call = "hvd.allreduce(%s%s, %s)" % (dtype.name, list(shape), op.name)
    eager = tf.executing_eagerly()
    record("hvd.allreduce", rank=state["rank"], dp_group=members, shape=list(shape), dtype=dtype.name,
           op=op.name, eager=eager)

    def reduce(value):
        # Runs on the rank thread (eager) or on a TensorFlow thread (graph): `state` names the rank.
        values = smp.exchange_among(state, members, key, call, np.asarray(value),
                                    "%s over the dp group" % call)
        total = values[0]
        for other in values[1:]:
            total = total + other
        if op is Average:
            total = total / len(values)
        return np.asarray(total, dtype=dtype.as_numpy_dtype)

    if eager:
        return tf.constant(reduce(tensor.numpy()))
    threads = _inter_op_threads()
    if threads < state["world"].size:
        raise RuntimeError("%s: hvd.allreduce inside a tf.function blocks one TensorFlow inter-op thread per "
                           "rank until its dp group arrives: run the %d ranks with at least %d inter-op threads "
                           "(TF_NUM_INTEROP_THREADS), not %d" % (FAKE, state["world"].size, state["world"].size,
                                                                 threads))
    graph = tf.compat.v1.get_default_graph()
    previous = getattr(graph, "_fake_horovod_last", None)
    with tf.control_dependencies([previous] if previous is not None else []):
        reduced = smp.stateful_numpy_function(reduce, [tensor], dtype, name="FakeHorovodAllreduce")
    reduced.set_shape(shape)
    graph._fake_horovod_last = reduced.op
    return reduced


def broadcast_variables(variables, root_rank, **others):
    """Assign the values of `variables` on dp rank `root_rank` to every member's `variables` (eagerly)."""
    _refuse("broadcast_variables", others)
    state = _ready("broadcast_variables")
    if not tf.executing_eagerly():
        raise NotImplementedError("%s: hvd.broadcast_variables inside a tf.function is not emulated" % FAKE)
    variables = list(variables)
    if not isinstance(root_rank, int) or isinstance(root_rank, bool) or not 0 <= root_rank < smp.dp_size():
        raise ValueError("%s: hvd.broadcast_variables(root_rank=%r): a Horovod rank below hvd.size()=%d"
                         % (FAKE, root_rank, smp.dp_size()))
    if not all(isinstance(variable, tf.Variable) for variable in variables):
        raise TypeError("%s: hvd.broadcast_variables takes tf.Variables" % FAKE)
    members, key = _channel()
    signature = [(tuple(variable.shape), variable.dtype.name) for variable in variables]
    root = smp.dp_rank() == root_rank
    record("hvd.broadcast_variables", rank=state["rank"], dp_group=members, variables=len(variables),
           root_rank=root_rank)
    contributions = smp.exchange_among(
        state, members, key, "hvd.broadcast_variables(%d variables, root_rank=%d)" % (len(variables), root_rank),
        (signature, [variable.numpy() for variable in variables] if root else None),
        "hvd.broadcast_variables over the dp group")
    if any(theirs != signature for theirs, _ in contributions):
        raise ValueError("%s: hvd.broadcast_variables: the ranks of dp group %s pass different variables (shape, "
                         "dtype): %s" % (FAKE, members, [theirs[:3] for theirs, _ in contributions]))
    if not root:
        for variable, value in zip(variables, contributions[root_rank][1]):
            variable.assign(value)


def _not_emulated(name):
    raise AttributeError("%s: %s is not emulated (only horovod.tensorflow.%s)"
                         % (FAKE, name, ", .".join(PUBLIC)))


def _modules():
    """Fresh module objects `horovod` and `horovod.tensorflow` holding only the public names."""
    hvd = types.ModuleType("horovod.tensorflow", __doc__)
    for name in PUBLIC:
        setattr(hvd, name, globals()[name])
    hvd.__getattr__ = lambda name: _not_emulated("horovod.tensorflow." + name)
    parent = types.ModuleType("horovod", "FAKE horovod package: only horovod.tensorflow (see %s)" % __name__)
    parent.__path__ = []
    parent.tensorflow = hvd
    parent.__getattr__ = lambda name: _not_emulated("horovod." + name)
    return {"horovod": parent, "horovod.tensorflow": hvd}


@contextlib.contextmanager
def installed():
    """`import horovod.tensorflow` finds this fake while the block runs (run_ranks), then what was there."""
    modules = _modules()
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield modules["horovod.tensorflow"]
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
