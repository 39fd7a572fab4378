"""The second model family: a recurrent language model (embedding, GRU/LSTM layers, final
LayerNorm, output tied to the embedding). Registered in `lm.spec.families.FAMILIES` as "rnn".

It has no key/value cache: `lm.serving.generate` recomputes the whole sequence for it, and left
padding is skipped through the Keras RNN mask.
"""
from lm.compat import keras, tf
from lm.spec.families import RNNConfig

INIT_STDDEV = 0.02


class RNNLM(keras.Model):
    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.model_config = config if isinstance(config, RNNConfig) else RNNConfig.from_dict(config)
        c = self.model_config
        cell = keras.layers.GRU if c.cell == "gru" else keras.layers.LSTM
        self.embedding = keras.layers.Embedding(
            c.padded_vocab_size, c.d_model, embeddings_initializer=keras.initializers.RandomNormal(stddev=INIT_STDDEV),
            name="embedding")
        self.dropout = keras.layers.Dropout(c.dropout)
        self.rnns = [cell(c.d_model, return_sequences=True, name="%s_%d" % (c.cell, i)) for i in range(c.n_layer)]
        self.ln_f = keras.layers.LayerNormalization(epsilon=1e-5, name="ln_f")
        self.head = None if c.tie_embeddings else keras.layers.Dense(
            c.padded_vocab_size, use_bias=False, kernel_initializer=keras.initializers.RandomNormal(stddev=INIT_STDDEV),
            name="head")

    def call(self, tokens, training=None):
        return self._forward(tokens, None, training)

    def _forward(self, tokens, valid, training):
        x = self.dropout(self.embedding(tokens), training=training)
        for rnn in self.rnns:
            x = self.dropout(rnn(x, mask=valid, training=training), training=training)
        x = self.ln_f(x)
        if self.head is None:
            logits = tf.einsum("bsd,vd->bsv", x, tf.cast(self.embedding.embeddings, x.dtype))
        else:
            logits = self.head(x)
        return tf.cast(logits, tf.float32)

    def decode(self, tokens, valid, caches=None, index=0):
        """Logits for tokens [b, s] whose `valid` [b, s] marks real (not padding) tokens."""
        if caches is not None:
            raise ValueError("the rnn family has no key/value cache; call decode without caches")
        return self._forward(tokens, valid, False), None

    def get_config(self):
        return {"config": self.model_config.to_dict(), "name": self.name}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)


def build_model(config, recompute=False):
    """The RNN language model for `config` with its weights created."""
    if recompute:
        raise ValueError("hyperparameters.recompute is not supported by model rnn; allowed: false")
    model = RNNLM(config, name="rnn")
    model(tf.zeros([1, 1], tf.int32))
    return model
