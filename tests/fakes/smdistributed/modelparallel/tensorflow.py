"""FAKE `smdistributed.modelparallel.tensorflow` (SMP v1) for tests: not AWS's library.

Implements the documented TF API subset lmstack uses (SageMaker Python SDK v2,
doc/api/training/smp_versions/latest/smd_model_parallel_common_api.rst and
smd_model_parallel_tensorflow.rst): init, step, StepOutput (outputs, reduce_mean, merge,
accumulate), DistributedModel, the rank/size queries and barrier.
Nothing is partitioned: `step` splits the tensor inputs along the batch axis into
`microbatches` pieces and runs the function once per piece inside a `tf.function`.
mp_parameters come from SM_HP_MP_PARAMETERS; with "horovod": true, init() initializes
Horovod itself, as the library does (scripts must never call hvd.init).
"""
import functools
import inspect
import json
import os

from lm.compat import keras, tf
from smdistributed import env_int, record

_state = {"initialized": False, "config": None, "in_step": False}


def _require_init(name):
    if not _state["initialized"]:
        raise RuntimeError("fake smdistributed.modelparallel: %s() before smp.init()" % name)


def init():
    if _state["initialized"]:
        raise RuntimeError("fake smdistributed.modelparallel: smp.init() called twice")
    config = json.loads(os.environ.get("SM_HP_MP_PARAMETERS") or "{}")
    if "partitions" not in config:
        raise ValueError("fake smdistributed.modelparallel: mp_parameters need 'partitions'")
    config.setdefault("microbatches", 1)
    _state.update(initialized=True, config=config)
    record("smp.init", mp_parameters=config)
    if config.get("horovod"):
        import horovod.tensorflow as hvd
        hvd.init()


def reset():
    """Test helper (not part of the library): forget init."""
    _state.update(initialized=False, config=None, in_step=False)


def _config():
    _require_init("config")
    return _state["config"]


def mp_size():
    _require_init("mp_size")
    return int(_config()["partitions"])


def size():
    _require_init("size")
    return env_int("FAKE_SMP_SIZE", mp_size())


def rank():
    _require_init("rank")
    return env_int("FAKE_SMP_RANK", 0)


def local_size():
    _require_init("local_size")
    return env_int("FAKE_SMP_LOCAL_SIZE", size())


def local_rank():
    _require_init("local_rank")
    return rank() % local_size()


# The fake's layout: the partitions of one model replica hold consecutive ranks.
def mp_rank():
    _require_init("mp_rank")
    return rank() % mp_size()


def dp_size():
    _require_init("dp_size")
    if size() % mp_size():
        raise ValueError("fake smdistributed.modelparallel: size %d is not a multiple of partitions %d"
                         % (size(), mp_size()))
    return size() // mp_size()


def dp_rank():
    _require_init("dp_rank")
    return rank() // mp_size()


def barrier(group=None):
    _require_init("barrier")
    record("smp.barrier")


class StepOutput(object):
    """All microbatch versions of one tensor returned from an smp.step function."""

    def __init__(self, outputs):
        self.outputs = list(outputs)

    def reduce_mean(self):
        return tf.add_n(self.outputs) / tf.cast(len(self.outputs), self.outputs[0].dtype)

    def merge(self):
        return tf.concat(self.outputs, axis=0)

    def accumulate(self, method="variable", var=None):
        if method not in ("add_n", "accumulate_n", "variable"):
            raise ValueError("fake smdistributed.modelparallel: accumulate(method=%r)" % (method,))
        return self.reduce_mean()


def _split(value, microbatches, axis, name):
    if isinstance(value, (tf.Tensor, tf.Variable)) or hasattr(value, "dtype") and hasattr(value, "shape"):
        value = tf.convert_to_tensor(value)
        length = value.shape[axis]
        if length is None:
            raise ValueError("fake smdistributed.modelparallel: argument %r has an unknown batch size; batch "
                             "with drop_remainder=True" % name)
        if length % microbatches:
            raise ValueError("fake smdistributed.modelparallel: batch size %d of argument %r is not divisible "
                             "by microbatches=%d" % (length, name, microbatches))
        return tf.split(value, microbatches, axis=axis)
    if isinstance(value, (list, tuple)):
        parts = [_split(item, microbatches, axis, name) for item in value]
        return [type(value)(part[i] for part in parts) for i in range(microbatches)]
    if isinstance(value, dict):
        parts = {key: _split(item, microbatches, axis, name) for key, item in value.items()}
        return [{key: part[i] for key, part in parts.items()} for i in range(microbatches)]
    return [value] * microbatches


def _is_tensor(value):
    return isinstance(value, (tf.Tensor, tf.Variable))


def step(function=None, non_split_inputs=None, input_split_axes=None, **tf_function_kwargs):
    """`@smp.step` or `@smp.step(non_split_inputs=..., input_split_axes=..., **tf.function args)`."""
    if function is None:
        return functools.partial(step, non_split_inputs=non_split_inputs, input_split_axes=input_split_axes,
                                 **tf_function_kwargs)
    non_split = set(non_split_inputs or ())
    axes = dict(input_split_axes or {})
    signature = inspect.signature(function)
    traced = tf.function(function, **tf_function_kwargs)

    @functools.wraps(function)
    def run(*args, **kwargs):
        _require_init("step")
        microbatches = int(_config()["microbatches"])
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        per_mb = [dict() for _ in range(microbatches)]
        for name, value in bound.arguments.items():
            pieces = [value] * microbatches if name in non_split else _split(value, microbatches,
                                                                          axes.get(name, 0), name)
            for index, piece in enumerate(pieces):
                per_mb[index][name] = piece
        record("smp.step", function=function.__name__, microbatches=microbatches,
               shapes={name: list(getattr(v, "shape", ())) for name, v in per_mb[0].items() if _is_tensor(v)})
        outputs = []
        _state["in_step"] = True
        try:
            for values in per_mb:
                outputs.append(traced(**values))
        finally:
            _state["in_step"] = False
        first = outputs[0]
        flat = [tf.nest.flatten(out) for out in outputs]
        wrapped = [StepOutput([f[i] for f in flat]) if _is_tensor(item) else item
                   for i, item in enumerate(tf.nest.flatten(first))]
        return tf.nest.pack_sequence_as(first, wrapped)

    return run


class DistributedModel(keras.Model):
    """Subclass and implement `call`; calling the model is allowed only inside smp.step."""

    def __call__(self, *args, **kwargs):
        if not _state["in_step"]:
            raise RuntimeError("fake smdistributed.modelparallel: a DistributedModel is called outside smp.step")
        record("smp.DistributedModel.__call__", model=type(self).__name__)
        return super(DistributedModel, self).__call__(*args, **kwargs)
