"""The building blocks every family's model is made of (Keras 2 through `lm.compat`).

Plain functions on tensors, so a model file reads as its architecture: masks, dropout that
recomputation can redraw (and the step's seeds for it), dense layers as single 2-D MatMuls, the
generation path's mask and positions, and the key/value cache update.
"""
from lm.compat import keras, tf

# Added to masked attention scores (in float32); finite so a fully masked row stays NaN-free.
MASKED = -1e9
INIT_STDDEV = 0.02


def normal(stddev):
    return keras.initializers.RandomNormal(stddev=stddev)


def causal_bias(length):
    """[1, 1, length, length] float32: 0 where query i may see key j (j <= i), MASKED elsewhere."""
    allowed = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)
    return tf.where(allowed, 0.0, MASKED)[tf.newaxis, tf.newaxis]


def dropout(x, rate, seed):
    """Inverted dropout from a stateless seed, so recomputation in the backward pass redraws the
    same mask; `seed` None (inference) or rate 0 is the identity."""
    if seed is None or not rate:
        return x
    keep = tf.random.stateless_uniform(tf.shape(x), seed=seed) >= rate
    return tf.where(keep, x * tf.cast(1.0 / (1.0 - rate), x.dtype), tf.zeros_like(x))


def dropout_seeds(count, rate, key, training):
    """`count` [2] int32 seeds for one training step's dropout masks (Nones when not training or
    `rate` is 0): drawn from `key()`, the step's [2] int64 seed (lm.checkpoint.DropoutKey),
    so a resumed run draws the masks an uninterrupted one draws; from TensorFlow's global generator
    when `key` is None."""
    if not training or not rate:
        return [None] * count
    if key is not None:
        return tf.unstack(tf.random.stateless_uniform([count, 2], seed=key(), minval=0, maxval=2 ** 31 - 1,
                                                      dtype=tf.int32))
    return tf.unstack(tf.random.uniform([count, 2], maxval=2 ** 31 - 1, dtype=tf.int32))


def decode_bias_and_positions(valid, index, length):
    """For `length` tokens at slots index..index+length-1 of the keys `valid` [b, keys] marks real:
    the additive attention bias [b, 1, length, keys] (each token sees the valid keys up to its own
    slot) and their positions [b, length], counting valid slots, so a left-padded prompt gets the
    positions it has alone."""
    queries = index + tf.range(length)
    causal = tf.range(tf.shape(valid)[1])[tf.newaxis, :] <= queries[:, tf.newaxis]
    allowed = tf.logical_and(causal[tf.newaxis], valid[:, tf.newaxis, :])
    positions = tf.maximum(tf.cumsum(tf.cast(valid, tf.int32), axis=1) - 1, 0)
    return tf.where(allowed, 0.0, MASKED)[:, tf.newaxis], tf.gather(positions, queries, axis=1)


def sub_seed(seed, index):
    return None if seed is None else seed + tf.constant([0, index], seed.dtype)


def matmul_last(x, matrix, transpose_b=False):
    """x [..., in] @ matrix as one 2-D MatMul: its gradients are MatMuls with transposed operands,
    where einsum's gradients copy transposes of their [tokens, out] operand first."""
    inner = matrix.shape[1] if transpose_b else matrix.shape[0]
    outer = matrix.shape[0] if transpose_b else matrix.shape[1]
    y = tf.matmul(tf.reshape(x, [-1, inner]), tf.cast(matrix, x.dtype), transpose_b=transpose_b)
    return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [outer]], axis=0))


def dense(x, kernel, bias=None):
    """x [..., in] @ kernel [in, out] + bias (BiasAdd: its gradient is one reduction)."""
    y = matmul_last(x, kernel)
    return y if bias is None else tf.nn.bias_add(y, tf.cast(bias, x.dtype))


def empty_caches(layers, shape, dtype):
    """One (keys, values) pair of zeros `shape` [batch, heads, slots, head_dim] per layer."""
    return [(tf.zeros(shape, dtype), tf.zeros(shape, dtype)) for _ in range(layers)]


def update_cache(cache, new, index):
    """Write `new` [b, h, s, d] into `cache` [b, h, T, d] at positions index..index+s-1.

    A one-hot blend instead of a scatter keeps every shape static (one trace, XLA friendly)."""
    slots = tf.one_hot(index + tf.range(tf.shape(new)[2]), tf.shape(cache)[2], dtype=cache.dtype)
    keep = 1.0 - tf.reduce_sum(slots, axis=0)
    return cache * keep[tf.newaxis, tf.newaxis, :, tf.newaxis] + tf.einsum("st,bhsd->bhtd", slots, new)
