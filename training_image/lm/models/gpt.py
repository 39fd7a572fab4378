"""A GPT decoder in Keras 2: token + position embeddings, N transformer blocks, tied output.

`build_model(config)` maps int32 tokens [batch, seq] to float32 logits
[batch, seq, config.padded_vocab_size]. Pre-LN + GELU by default; `norm="post",
activation="relu", head_dim=d_model` is the seed's block, kept for the benchmark.

`GPT.decode` is the generation path: the same blocks, with left padding masked out and an
optional per-layer key/value cache (see `lm.serving.generate`).

The classes are written once, without a Keras base, and made per Keras by `gpt_classes`: SMP v1's
model is built on TensorFlow's bundled Keras, the others on `lm.compat.keras`.

A variant of the block (a family derived from GPT) subclasses the code, not the model: `BlockCode`
with its own `residual` (how x, its attention and its MLP combine; the key/value cache and attention
are shared), a `GPTCode` subclass naming its `block_code` and `config_class`, and `gpt_classes(keras,
that code)` makes its layers on either Keras, SMP's included (docs/fork.md, "Derive a family").
"""
import contextlib
import functools
import math
import types

from lm.compat import keras, tf
from lm.models.layers import (INIT_STDDEV, causal_bias, decode_bias_and_positions, dense, dropout, dropout_seeds,
                              empty_caches, matmul_last, normal, sub_seed, update_cache)
from lm.spec.families import GPTConfig

__all__ = ["GPT", "BlockCode", "GPTCode", "build_model", "gpt_classes"]

LAYER_NORM_EPSILON = 1e-5


class _Embedding:
    """Token and learned position embeddings, summed; `project` reuses the token table as the
    output layer (tied weights)."""

    def __init__(self, vocab_size, block_size, d_model, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.block_size, self.d_model = vocab_size, block_size, d_model

    def build(self, input_shape):
        self.token_table = self.add_weight(
            "token_table", shape=[self.vocab_size, self.d_model], initializer=normal(INIT_STDDEV))
        self.position_table = self.add_weight(
            "position_table", shape=[self.block_size, self.d_model], initializer=normal(INIT_STDDEV))
        super().build(input_shape)

    def call(self, tokens, positions=None):
        if positions is None:
            positions = tf.range(tf.shape(tokens)[1])[tf.newaxis]
        return tf.gather(self.token_table, tokens) + tf.gather(self.position_table, positions)

    def project(self, x):
        return matmul_last(x, self.token_table, transpose_b=True)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, block_size=self.block_size, d_model=self.d_model)
        return config


class _LayerNorm:
    """Layer normalization over the last axis, computed as Keras' LayerNormalization computes it at
    this epsilon (below what its fused kernel allows): moments and the affine map in float32, float32
    gamma and beta. Ours because TensorFlow's bundled Keras, which SMP v1's model is built on, has
    none in TF 2.15 (the main test environment; TF 2.6's has)."""

    def __init__(self, epsilon=LAYER_NORM_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        width = [tf.TensorShape(input_shape)[-1]]
        self.gamma = self.add_weight("gamma", shape=width, initializer="ones", experimental_autocast=False)
        self.beta = self.add_weight("beta", shape=width, initializer="zeros", experimental_autocast=False)
        super().build(input_shape)

    def call(self, x):
        dtype, x = x.dtype, tf.cast(x, tf.float32)
        mean, variance = tf.nn.moments(x, [x.shape.rank - 1], keepdims=True)
        return tf.cast(tf.nn.batch_normalization(x, mean, variance, offset=self.beta, scale=self.gamma,
                                                 variance_epsilon=self.epsilon), dtype)

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon)
        return config


class _CausalSelfAttention:
    """Multi-head self-attention with one fused QKV projection; the caller passes the additive
    attention bias (causal, plus padding in generation)."""

    def __init__(self, d_model, n_head, head_dim, dropout_rate=0.0, output_stddev=INIT_STDDEV, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.n_head, self.head_dim = d_model, n_head, head_dim
        self.dropout_rate, self.output_stddev = dropout_rate, output_stddev

    def build(self, input_shape):
        inner = self.n_head * self.head_dim
        self.qkv_kernel = self.add_weight("qkv_kernel", shape=[self.d_model, 3 * inner],
                                          initializer=normal(INIT_STDDEV))
        self.qkv_bias = self.add_weight("qkv_bias", shape=[3 * inner], initializer="zeros")
        self.output_kernel = self.add_weight("output_kernel", shape=[inner, self.d_model],
                                             initializer=normal(self.output_stddev))
        self.output_bias = self.add_weight("output_bias", shape=[self.d_model], initializer="zeros")
        super().build(input_shape)

    def project_qkv(self, x):
        """Queries (already scaled by 1/sqrt(head_dim)), keys, values: each [batch, head, seq, head_dim]."""
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        qkv = tf.reshape(dense(x, self.qkv_kernel, self.qkv_bias), [batch, length, 3, self.n_head, self.head_dim])
        q, k, v = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))
        return q * tf.cast(1.0 / math.sqrt(self.head_dim), q.dtype), k, v

    def attend(self, q, k, v, bias, seed=None):
        scores = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32) + bias
        probs = dropout(tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype), self.dropout_rate, seed)
        y = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])
        y = tf.reshape(y, [tf.shape(y)[0], tf.shape(y)[1], self.n_head * self.head_dim])
        return dense(y, self.output_kernel, self.output_bias)

    def call(self, x, bias, seed=None):
        q, k, v = self.project_qkv(x)
        return self.attend(q, k, v, bias, seed)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, n_head=self.n_head, head_dim=self.head_dim,
                      dropout_rate=self.dropout_rate, output_stddev=self.output_stddev)
        return config


class _MLP:
    """d_model -> 4 * d_model -> d_model."""

    def __init__(self, d_model, activation="gelu", output_stddev=INIT_STDDEV, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.activation, self.output_stddev = d_model, activation, output_stddev

    def build(self, input_shape):
        hidden = 4 * self.d_model
        self.fc_kernel = self.add_weight("fc_kernel", shape=[self.d_model, hidden], initializer=normal(INIT_STDDEV))
        self.fc_bias = self.add_weight("fc_bias", shape=[hidden], initializer="zeros")
        self.proj_kernel = self.add_weight("proj_kernel", shape=[hidden, self.d_model],
                                           initializer=normal(self.output_stddev))
        self.proj_bias = self.add_weight("proj_bias", shape=[self.d_model], initializer="zeros")
        super().build(input_shape)

    def call(self, x):
        h = dense(x, self.fc_kernel, self.fc_bias)
        h = tf.nn.gelu(h, approximate=True) if self.activation == "gelu" else tf.nn.relu(h)
        return dense(h, self.proj_kernel, self.proj_bias)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, activation=self.activation, output_stddev=self.output_stddev)
        return config


class BlockCode:
    """One transformer block: attention and MLP sublayers with residuals and LayerNorm,
    before each sublayer ("pre") or after each residual ("post", the seed)."""

    def __init__(self, d_model, n_head, head_dim, norm="pre", activation="gelu", dropout_rate=0.0,
                 output_stddev=INIT_STDDEV, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.n_head, self.head_dim = d_model, n_head, head_dim
        self.norm, self.activation, self.dropout_rate, self.output_stddev = norm, activation, dropout_rate, output_stddev
        classes = self.classes
        self.ln_1 = classes.LayerNorm(name="ln_1")
        self.attention = classes.CausalSelfAttention(d_model, n_head, head_dim, dropout_rate, output_stddev,
                                                     name="attention")
        self.ln_2 = classes.LayerNorm(name="ln_2")
        self.mlp = classes.MLP(d_model, activation, output_stddev, name="mlp")

    def build(self, input_shape):
        # Every sublayer here, each under its name as its own call would: the attention is used
        # through its methods, so never built by a call; and SMP v1's ranks build only the layers
        # the library lists, with build(), never calling them. On TF >= 2.5 those are the model's
        # own layers (the blocks), not theirs (lm.distributed.smp).
        for layer in (self.attention, self.ln_1, self.ln_2, self.mlp):
            with tf.name_scope(layer.name):
                layer.build(input_shape)
        super().build(input_shape)

    def call(self, x, bias, seed=None):
        return self.decode(x, bias, seed=seed)[0]

    def decode(self, x, bias, cache=None, index=None, seed=None):
        """The block on x [b, s, d]; with `cache` (keys, values [b, h, T, hd]) x sits at positions
        index..index+s-1 of it. Returns (output, (keys, values)): the updated cache, or this
        call's own keys and values when there is no cache."""
        keys_values = []

        def attention(h):
            q, k, v = self.attention.project_qkv(h)
            if cache is not None:
                k, v = update_cache(cache[0], k, index), update_cache(cache[1], v, index)
            keys_values.append((k, v))
            return dropout(self.attention.attend(q, k, v, bias, sub_seed(seed, 1)), self.dropout_rate,
                           sub_seed(seed, 2))

        return self.residual(x, attention, seed), keys_values[0]

    def mlp_step(self, h, seed):
        """The MLP on h with its dropout (the mask of `seed`'s sub-seed 3)."""
        return dropout(self.mlp(h), self.dropout_rate, sub_seed(seed, 3))

    def residual(self, x, attention, seed):
        """The block's residual step: x, `attention(h)` (the attended and dropped-out output for input
        h, called once; it reads and writes the cache) and the MLP (`mlp_step`) combined. Sequential:
        LayerNorm before each sublayer ("pre") or after each residual ("post"). A block variant (a
        parallel block: x + attention(ln_1(x)) + mlp(ln_2(x))) overrides this method only."""
        if self.norm == "pre":
            h = x + attention(self.ln_1(x))
            return h + self.mlp_step(self.ln_2(h), seed)
        h = self.ln_1(x + attention(x))
        return self.ln_2(h + self.mlp_step(h, seed))

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, n_head=self.n_head, head_dim=self.head_dim, norm=self.norm,
                      activation=self.activation, dropout_rate=self.dropout_rate, output_stddev=self.output_stddev)
        return config


class GPTCode:
    """The decoder. `recompute=True` recomputes each block's activations in the backward pass
    (tf.recompute_grad) to trade compute for memory."""

    # What a derived family's model (a subclass of this code) declares: the config it is built from
    # (its family's, a GPTConfig subclass) and the code of its blocks (a `BlockCode` subclass), which
    # `gpt_classes` makes the model's `block_class` on the model's Keras.
    config_class = GPTConfig
    block_code = BlockCode

    def __init__(self, config, recompute=False, **kwargs):
        super().__init__(**kwargs)
        config_class = self.config_class
        self.model_config = config if isinstance(config, config_class) else config_class.from_dict(config)
        self.recompute = recompute
        c = self.model_config
        residual_stddev = INIT_STDDEV / math.sqrt(2 * c.n_layer)
        classes = self.classes
        self.embedding = classes.Embedding(c.padded_vocab_size, c.block_size, c.d_model, name="embedding")
        self.blocks = [self.block_class(c.d_model, c.n_head, c.attention_head_dim, c.norm, c.activation, c.dropout,
                                        residual_stddev, name="block_%d" % i) for i in range(c.n_layer)]
        self.ln_f = classes.LayerNorm(name="ln_f")
        self.head = None if c.tie_embeddings else classes.keras.layers.Dense(
            c.padded_vocab_size, use_bias=False, kernel_initializer=normal(INIT_STDDEV), name="head")

    # A callable giving the [2] int64 seed of this step's dropout masks (lm.checkpoint.DropoutKey,
    # set by lm.training.train: a resumed run then draws the masks an uninterrupted one draws); None draws
    # them from TensorFlow's global generator.
    dropout_key = None

    def _dropout_seeds(self, training):
        return dropout_seeds(self.model_config.n_layer + 1, self.model_config.dropout, self.dropout_key, training)

    def _logits(self, x):
        x = self.ln_f(x)
        logits = self.embedding.project(x) if self.head is None else self.head(x)
        return tf.cast(logits, tf.float32)

    # None, or a method mapping a layer to a context manager that places it (its variables and
    # operations): `place(None)` for the embeddings and the output, `place(i)` for block i. SMP v1's
    # DistributedGPT defines it to put each block in its pipeline partition (lm.distributed.smp).
    place = None

    def _placed(self, block_index):
        return contextlib.nullcontext() if self.place is None else self.place(block_index)

    def call(self, tokens, training=None):
        bias = causal_bias(tf.shape(tokens)[1])
        seeds = self._dropout_seeds(training)
        with self._placed(None):
            x = dropout(self.embedding(tokens), self.model_config.dropout, seeds[-1])
        for index, (block, seed) in enumerate(zip(self.blocks, seeds)):
            with self._placed(index):
                if self.recompute and training:
                    x = tf.recompute_grad(lambda h, block=block, seed=seed: block(h, bias, seed=seed))(x)
                else:
                    x = block(x, bias, seed=seed)
        with self._placed(None):
            return self._logits(x)

    def init_cache(self, batch, length):
        """Empty key/value caches for `length` slots: one (keys, values) pair per layer."""
        c = self.model_config
        return empty_caches(len(self.blocks), [batch, c.n_head, length, c.attention_head_dim], self.compute_dtype)

    def decode(self, tokens, valid, caches=None, index=0):
        """Inference on tokens [b, s] (left padding allowed) -> (float32 logits [b, s, vocab], caches).

        `valid` [b, keys] marks real tokens among the keys: without `caches` the keys are these
        tokens (keys = s); with `caches` (from `init_cache`, keys = their length) the tokens are
        written at slots index..index+s-1 and attend to every valid slot up to their own.
        Positions count valid slots, so a left-padded prompt gets the positions it has alone."""
        bias, positions = decode_bias_and_positions(valid, index, tf.shape(tokens)[1])
        x = self.embedding(tokens, positions)
        new_caches = []
        for i, block in enumerate(self.blocks):
            x, kv = block.decode(x, bias, None if caches is None else caches[i], index)
            new_caches.append(kv)
        return self._logits(x), new_caches

    def get_config(self):
        return {"config": self.model_config.to_dict(), "recompute": self.recompute, "name": self.name}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)


def gpt_classes(keras, model_code=GPTCode):
    """The layer and model classes of `model_code` (the GPT's, or a subclass of its code) on `keras`:
    one class tree (see `lm.compat.keras_of`).

    The classes above hold the code; each Keras gets classes of its own that put it under them, and
    each reaches the others of its Keras as `self.classes` (the model's blocks: `block_class`, made
    from its `block_code`; each made class keeps its code as `code`). This module's `GPT`, `Block`, ...
    are those of `lm.compat.keras`; SMP v1's DistributedGPT is the model of the Keras its
    `DistributedModel` derives from (`lm.distributed.smp`). Initial values come from
    `lm.models.layers.normal` whichever Keras holds the layers, so both draw the same ones."""
    return _class_tree(keras, model_code)  # one tree per (Keras, code), however the code is passed


def _made_name(code):
    """The name of a class made from `code`: "Block" from BlockCode, "Embedding" from _Embedding,
    "ParallelBlock" from a variant's _ParallelBlock."""
    name = code.__name__.lstrip("_")
    return name[:-len("Code")] if name.endswith("Code") else name


@functools.lru_cache(maxsize=None)
def _class_tree(keras, model_code):
    classes = types.SimpleNamespace(keras=keras)
    for role, code, base in (("Embedding", _Embedding, keras.layers.Layer), ("LayerNorm", _LayerNorm, keras.layers.Layer),
                             ("CausalSelfAttention", _CausalSelfAttention, keras.layers.Layer),
                             ("MLP", _MLP, keras.layers.Layer), ("Block", model_code.block_code, keras.layers.Layer),
                             ("GPT", model_code, keras.Model)):
        setattr(classes, role, type(_made_name(code), (code, base), {
            "__module__": code.__module__, "__doc__": code.__doc__, "classes": classes, "code": code}))
    classes.GPT.block_class = classes.Block
    return classes


_ours = gpt_classes(keras)
Embedding, LayerNorm, CausalSelfAttention, MLP, Block, GPT = (
    _ours.Embedding, _ours.LayerNorm, _ours.CausalSelfAttention, _ours.MLP, _ours.Block, _ours.GPT)


def build_model(config, recompute=False, build=True, model_class=GPT, distribute=None):
    """The GPT (or `model_class`, a derived family's model) for `config` with its weights created
    (call it on int32 tokens [batch, seq]), named after its family.

    `build=False` leaves the weights to its first call. `distribute`: a function making the class to
    construct from `model_class` (SMP v1's DistributedGPT, `lm.distributed.smp.distributed_gpt_class`),
    constructed from plain arguments: the config as a dict, `recompute` and the name, which that
    library passes again to build its tracing copy."""
    made = model_class if distribute is None else distribute(model_class)
    model = made(config.to_dict(), recompute=recompute, name=config.family)
    if build:
        model(tf.zeros([1, 1], tf.int32))
    return model

