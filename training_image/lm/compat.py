"""The one place that imports TensorFlow and Keras: `from lm.compat import tf, keras`.

Keras 2 semantics on every TF we run on, from 2.6 (the SMP v1 image) to current: TF >= 2.16
ships Keras 3 as `tf.keras`, so there we use the `tf_keras` package, and TF_USE_LEGACY_KERAS=1
makes TF's own helpers (and `tf.keras` seen by other libraries) agree.
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

__all__ = ["tf", "keras", "TF_VERSION"]
