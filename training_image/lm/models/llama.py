"""A Llama-style decoder in Keras 2: token embedding, N blocks of RMSNorm -> grouped-query attention
with rotary position embeddings -> RMSNorm -> SwiGLU MLP, final RMSNorm, output head. No biases.
Registered in `lm.spec.families.FAMILIES` as "llama" (config: `lm.spec.families.llama.LlamaConfig`).

Conventions are transformers' PyTorch Llama (modeling_llama.py, modeling_rope_utils.py), so
`lm.hf.llama` maps the weights one to one: rotary embeddings rotate the two halves of each head
(`rotate_half`) at transformers' frequencies (Llama 3.1/3.2's "llama3" rope scaling included), query
head h shares key/value head h // (n_head // n_kv_head), and RMSNorm normalizes in float32. `decode`
is the generation path with a per-layer key/value cache of the n_kv_head key/value heads (see
`lm.serving.generate`); dropout masks and `recompute` as in `lm.models.gpt.GPT`.
"""
import math

import numpy as np

from lm.compat import keras, tf
from lm.models.layers import (INIT_STDDEV, causal_bias, decode_bias_and_positions, dropout, dropout_seeds,
                              empty_caches, matmul_last, normal, sub_seed, update_cache)
from lm.spec.families import LlamaConfig

__all__ = ["Llama", "build_model"]


class RMSNorm(keras.layers.Layer):
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32."""

    def __init__(self, epsilon, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.weight = self.add_weight("weight", shape=[input_shape[-1]], initializer="ones")
        super().build(input_shape)

    def call(self, x):
        x32 = tf.cast(x, tf.float32)
        normed = x32 * tf.math.rsqrt(tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True) + self.epsilon)
        return tf.cast(normed, x.dtype) * tf.cast(self.weight, x.dtype)

    def get_config(self):
        return dict(super().get_config(), epsilon=self.epsilon)


def inverse_frequencies(head_dim, theta, rope_scaling=None):
    """The rotary frequency of the pair (i, i + head_dim/2), float32 as transformers computes it:
    theta^(-2i/head_dim) (modeling_rope_utils._compute_default_rope_parameters, transformers 4.46.3),
    and under Llama 3's "llama3" `rope_scaling` (`_compute_llama3_parameters`, same file, lines
    310-350) a wavelength 2 pi / frequency beyond original_max_position_embeddings / low_freq_factor
    stretched `factor` times, one below original_max_position_embeddings / high_freq_factor kept,
    and one between interpolated: (1 - s) f / factor + s f, s = (original / wavelength -
    low_freq_factor) / (high_freq_factor - low_freq_factor)."""
    frequencies = np.float32(1.0) / np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))
    if rope_scaling is None:
        return frequencies
    original, factor = rope_scaling.original_max_position_embeddings, np.float32(rope_scaling.factor)
    low, high = np.float32(rope_scaling.low_freq_factor), np.float32(rope_scaling.high_freq_factor)
    wavelengths = np.float32(2 * math.pi) / frequencies
    long_waves = np.where(wavelengths > original / low, frequencies / factor, frequencies)
    smooth = (original / wavelengths - low) / (high - low)
    interpolated = (1 - smooth) * long_waves / factor + smooth * long_waves
    medium = (wavelengths >= original / high) & (wavelengths <= original / low)
    return np.where(medium, interpolated, long_waves).astype(np.float32)


def rotary_angles(positions, frequencies):
    """(cos, sin) [b, 1, s, head_dim] of positions [b, s] and the pairs' `frequencies`
    (inverse_frequencies): the angle of pair (i, i + head_dim/2) is position x frequency i."""
    angles = tf.cast(positions, tf.float32)[..., tf.newaxis] * tf.constant(frequencies, tf.float32)
    angles = tf.concat([angles, angles], axis=-1)[:, tf.newaxis]
    return tf.cos(angles), tf.sin(angles)


def rotate(x, cos, sin):
    """x [b, h, s, head_dim] rotated by its positions' angles: x * cos + rotate_half(x) * sin."""
    first, second = tf.split(x, 2, axis=-1)
    return x * tf.cast(cos, x.dtype) + tf.concat([-second, first], axis=-1) * tf.cast(sin, x.dtype)


class Attention(keras.layers.Layer):
    """Grouped-query attention: n_head query heads, n_kv_head key/value heads."""

    def __init__(self, d_model, n_head, n_kv_head, dropout_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.n_head, self.n_kv_head, self.dropout_rate = d_model, n_head, n_kv_head, dropout_rate
        self.head_dim = d_model // n_head

    def build(self, input_shape):
        kv = self.n_kv_head * self.head_dim
        for name, shape in [("q_kernel", [self.d_model, self.d_model]), ("k_kernel", [self.d_model, kv]),
                            ("v_kernel", [self.d_model, kv]), ("o_kernel", [self.d_model, self.d_model])]:
            setattr(self, name, self.add_weight(name, shape=shape, initializer=normal(INIT_STDDEV)))
        super().build(input_shape)

    def _heads(self, x, kernel, heads):
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        return tf.transpose(tf.reshape(matmul_last(x, kernel), [batch, length, heads, self.head_dim]), [0, 2, 1, 3])

    def project_qkv(self, x, cos, sin):
        """Queries [b, n_head, s, hd] (rotated, scaled by 1/sqrt(hd)), keys (rotated) and values [b, n_kv_head, s, hd]."""
        q = rotate(self._heads(x, self.q_kernel, self.n_head), cos, sin)
        k = rotate(self._heads(x, self.k_kernel, self.n_kv_head), cos, sin)
        return q * tf.cast(self.head_dim ** -0.5, q.dtype), k, self._heads(x, self.v_kernel, self.n_kv_head)

    def attend(self, q, k, v, bias, seed=None):
        """The n_head // n_kv_head query heads of a group attend to its key/value head without copies
        of it: queries [b, kv, group * s, hd] against keys [b, kv, keys, hd]."""
        batch, length, keys = tf.shape(q)[0], tf.shape(q)[2], tf.shape(k)[2]
        grouped = tf.reshape(q, [batch, self.n_kv_head, -1, self.head_dim])
        scores = tf.reshape(tf.matmul(grouped, k, transpose_b=True), [batch, self.n_head, length, keys])
        probs = tf.nn.softmax(tf.cast(scores, tf.float32) + bias, axis=-1)
        probs = dropout(tf.cast(probs, v.dtype), self.dropout_rate, seed)
        y = tf.matmul(tf.reshape(probs, [batch, self.n_kv_head, -1, keys]), v)  # [b, kv, group * s, hd]
        y = tf.transpose(tf.reshape(y, [batch, self.n_head, length, self.head_dim]), [0, 2, 1, 3])
        return matmul_last(tf.reshape(y, [batch, length, self.d_model]), self.o_kernel)

    def get_config(self):
        return dict(super().get_config(), d_model=self.d_model, n_head=self.n_head, n_kv_head=self.n_kv_head,
                    dropout_rate=self.dropout_rate)


class SwiGLU(keras.layers.Layer):
    """down(silu(gate(x)) * up(x)), hidden width d_ff."""

    def __init__(self, d_model, d_ff, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff = d_model, d_ff

    def build(self, input_shape):
        self.gate_kernel = self.add_weight("gate_kernel", shape=[self.d_model, self.d_ff], initializer=normal(INIT_STDDEV))
        self.up_kernel = self.add_weight("up_kernel", shape=[self.d_model, self.d_ff], initializer=normal(INIT_STDDEV))
        self.down_kernel = self.add_weight("down_kernel", shape=[self.d_ff, self.d_model], initializer=normal(INIT_STDDEV))
        super().build(input_shape)

    def call(self, x):
        return matmul_last(tf.nn.silu(matmul_last(x, self.gate_kernel)) * matmul_last(x, self.up_kernel),
                            self.down_kernel)

    def get_config(self):
        return dict(super().get_config(), d_model=self.d_model, d_ff=self.d_ff)


class Block(keras.layers.Layer):
    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        c = self.model_config = config
        self.attention_norm = RMSNorm(c.norm_eps, name="input_layernorm")
        self.attention = Attention(c.d_model, c.n_head, c.n_kv_head, c.dropout, name="self_attn")
        self.mlp_norm = RMSNorm(c.norm_eps, name="post_attention_layernorm")
        self.mlp = SwiGLU(c.d_model, c.d_ff, name="mlp")

    def build(self, input_shape):
        with tf.name_scope(self.attention.name):  # used through its methods, so never built by a call
            self.attention.build(input_shape)
        super().build(input_shape)

    def call(self, x, bias, cos, sin, seed=None):
        return self.decode(x, bias, cos, sin, seed=seed)[0]

    def decode(self, x, bias, cos, sin, cache=None, index=None, seed=None):
        """As lm.models.gpt.Block.decode, with the rotary angles of x's positions."""
        q, k, v = self.attention.project_qkv(self.attention_norm(x), cos, sin)
        if cache is not None:
            k, v = update_cache(cache[0], k, index), update_cache(cache[1], v, index)
        rate = self.model_config.dropout
        h = x + dropout(self.attention.attend(q, k, v, bias, sub_seed(seed, 1)), rate, sub_seed(seed, 2))
        return h + dropout(self.mlp(self.mlp_norm(h)), rate, sub_seed(seed, 3)), (k, v)

    def get_config(self):
        return dict(super().get_config(), config=self.model_config.to_dict())


class Llama(keras.Model):
    """The decoder. `recompute=True` recomputes each block's activations in the backward pass."""

    dropout_key = None  # set by lm.training.train, as lm.models.gpt.GPT.dropout_key

    def __init__(self, config, recompute=False, **kwargs):
        super().__init__(**kwargs)
        c = self.model_config = config if isinstance(config, LlamaConfig) else LlamaConfig.from_dict(config)
        self.recompute = recompute
        self.frequencies = inverse_frequencies(c.head_dim, c.rope_theta, c.rope_scaling)
        self.embed_tokens = keras.layers.Embedding(c.padded_vocab_size, c.d_model,
                                                   embeddings_initializer=normal(INIT_STDDEV), name="embed_tokens")
        self.blocks = [Block(c, name="layer_%d" % i) for i in range(c.n_layer)]
        self.norm = RMSNorm(c.norm_eps, name="norm")
        self.lm_head = None if c.tie_embeddings else keras.layers.Dense(
            c.padded_vocab_size, use_bias=False, kernel_initializer=normal(INIT_STDDEV), name="lm_head")

    def _angles(self, positions):
        return rotary_angles(positions, self.frequencies)

    def _logits(self, x):
        x = self.norm(x)
        logits = matmul_last(x, self.embed_tokens.embeddings, transpose_b=True) if self.lm_head is None \
            else self.lm_head(x)
        return tf.cast(logits, tf.float32)

    def call(self, tokens, training=None):
        length = tf.shape(tokens)[1]
        bias, (cos, sin) = causal_bias(length), self._angles(tf.range(length)[tf.newaxis])
        seeds = dropout_seeds(len(self.blocks) + 1, self.model_config.dropout, self.dropout_key, training)
        x = dropout(self.embed_tokens(tokens), self.model_config.dropout, seeds[-1])
        for block, seed in zip(self.blocks, seeds):
            if self.recompute and training:
                x = tf.recompute_grad(lambda h, block=block, seed=seed: block(h, bias, cos, sin, seed=seed))(x)
            else:
                x = block(x, bias, cos, sin, seed=seed)
        return self._logits(x)

    def init_cache(self, batch, length):
        """Empty key/value caches for `length` slots: one (keys, values) pair per layer, n_kv_head heads."""
        c = self.model_config
        return empty_caches(len(self.blocks), [batch, c.n_kv_head, length, c.head_dim], self.compute_dtype)

    def decode(self, tokens, valid, caches=None, index=0):
        """As lm.models.gpt.GPT.decode: tokens [b, s] (left padding allowed) -> (float32 logits, caches)."""
        bias, positions = decode_bias_and_positions(valid, index, tf.shape(tokens)[1])
        cos, sin = self._angles(positions)
        x = self.embed_tokens(tokens)
        new_caches = []
        for i, block in enumerate(self.blocks):
            x, kv = block.decode(x, bias, cos, sin, None if caches is None else caches[i], index)
            new_caches.append(kv)
        return self._logits(x), new_caches

    def get_config(self):
        return {"config": self.model_config.to_dict(), "recompute": self.recompute, "name": self.name}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)


def build_model(config, recompute=False):
    """The Llama for `config` with its weights created (call it on int32 tokens [batch, seq])."""
    model = Llama(config.to_dict(), recompute=recompute, name="llama")
    model(tf.zeros([1, 1], tf.int32))
    return model
