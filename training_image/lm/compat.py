"""The one place that imports TensorFlow and Keras: `from lm.compat import tf, keras`.

Keras 2 semantics on every TF we run on, from 2.6 (the SMP v1 image) to current: TF >= 2.16
ships Keras 3 as `tf.keras`, so there we use the `tf_keras` package, and TF_USE_LEGACY_KERAS=1
makes TF's own helpers (and `tf.keras` seen by other libraries) agree.

TensorFlow also carries a Keras of its own, `tensorflow.python.keras`, another class tree (on TF 2.6
`tf.keras` is the separate keras 2.6 package). SMP v1's `DistributedModel` derives from that bundled
copy, so a model meant to be one is built on `keras_of(smp.DistributedModel)`, and
`set_precision_policy` sets the mixed-precision policy of both.
"""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf  # noqa: E402


def _version(text):
    parts = []
    for part in text.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


TF_VERSION = _version(tf.__version__)

if TF_VERSION >= (2, 16):
    import tf_keras as keras  # noqa: E402
else:
    keras = tf.keras


def _bundled_keras():
    from tensorflow.python import keras as bundled
    return bundled


def keras_of(model_class):
    """The Keras whose `Model` `model_class` derives from: `keras`, or the copy TensorFlow bundles.

    A model and its layers must come from one class tree: a Model of one does not track the layers
    of the other (its `layers` stay empty), and mixing the two in one class puts one tree's Model
    first in the MRO, so the other's `__init__` and `__call__` never run."""
    for candidate in (keras, _bundled_keras()):
        if issubclass(model_class, candidate.Model):
            return candidate
    raise TypeError("%s.%s derives from neither Keras this TensorFlow %s has (%s, %s)" % (
        model_class.__module__, model_class.__name__, tf.__version__, keras.__name__, _bundled_keras().__name__))


def set_precision_policy(name):
    """The mixed-precision policy ("float32", "mixed_float16", "mixed_bfloat16") of new layers of
    either Keras."""
    keras.mixed_precision.set_global_policy(name)
    from tensorflow.python.keras.mixed_precision import policy
    # TF 2.6's bundled copy names it set_policy; later ones set_global_policy.
    (getattr(policy, "set_global_policy", None) or policy.set_policy)(name)


__all__ = ["tf", "keras", "TF_VERSION", "keras_of", "set_precision_policy"]
