"""The RNN family (GRU or LSTM layers), the smallest example of a family: its configuration, declaration
and presets.

The model is `lm.models.rnn`. Pure Python 3.8, no TensorFlow: imported at synth time.
"""
import collections
import dataclasses

from lm.spec.families.base import GPT3_VOCAB_SIZE, PAD_VOCAB_TO, ModelConfig, ModelFamily, check_positive_ints


RNN_CELL_GATES = {"gru": (3, 2), "lstm": (4, 1)}  # cell -> (gates, bias vectors per gate)
# u-sized (micro_batch x seq_len x d_model) elements one recurrent layer keeps for its backward
# pass: the input, the state and the gates of every step. Measured once on TF's CPU allocator
# (Keras' generic while-loop kernel, float32, d_model 256, seq_len 128, batch 16: the peak of a
# step with 6 layers minus that with 2, less the layers' weights, gradients and AdamW state) at
# 8.6 (GRU) and 11.0 (LSTM), rounded up. An estimate for GPUs: cuDNN's kernel keeps its own
# reserve space, not measured.
RNN_CELL_U_ELEMENTS = {"gru": 9, "lstm": 11}


@dataclasses.dataclass(frozen=True)
class RNNConfig(ModelConfig):
    """The second family (`lm.models.rnn`): token embedding, n_layer GRU or LSTM layers, final
    LayerNorm, output tied to the embedding. block_size is the longest sequence it is
    trained on and generates (no position table)."""
    n_layer: int
    d_model: int
    cell: str = "gru"
    block_size: int = 2048
    vocab_size: int = GPT3_VOCAB_SIZE
    pad_vocab_to: int = PAD_VOCAB_TO
    dropout: float = 0.0
    tie_embeddings: bool = True
    family: str = "rnn"

    def __post_init__(self):
        check_positive_ints(self, ("n_layer", "d_model", "block_size", "vocab_size", "pad_vocab_to"))
        self.check_common()
        if self.cell not in RNN_CELL_GATES:
            raise ValueError("RNNConfig.cell must be one of %s, got %r" % (", ".join(RNN_CELL_GATES), self.cell))

    def block_parameter_count(self):
        """One recurrent layer: input and recurrent kernels and biases per gate (Keras GRU,
        reset_after=True, has two bias vectors per gate, LSTM one)."""
        gates, biases = RNN_CELL_GATES[self.cell]
        return gates * (2 * self.d_model * self.d_model + biases * self.d_model)

    def non_embedding_parameter_count(self):
        return self.n_layer * self.block_parameter_count() + 2 * self.d_model

    def parameter_count(self):
        head = 0 if self.tie_embeddings else self.padded_vocab_size * self.d_model
        return self.padded_vocab_size * self.d_model + self.non_embedding_parameter_count() + head

    def block_matmul_parameter_count(self):
        """The input and the recurrent kernel of every gate, applied at every step; no attention."""
        gates, _ = RNN_CELL_GATES[self.cell]
        return 2 * gates * self.d_model * self.d_model

    def block_activation_bytes(self, micro_batch, seq_len, compute_bytes, xla=False):
        """RNN_CELL_U_ELEMENTS u elements at the compute precision (XLA not measured: the same), plus
        the dropout after the layer (its output and a 1-byte mask) when dropout > 0."""
        u = micro_batch * seq_len * self.d_model
        total = RNN_CELL_U_ELEMENTS[self.cell] * u * compute_bytes
        if self.dropout:
            total += compute_bytes * u + u
        return total


# No key/value cache (generation recomputes), no recompute_grad, no Hugging Face layout, no SMP class.
FAMILY = ModelFamily(RNNConfig, "lm.models.rnn:build_model", (), None)

# One the demo's dataset trains, one with a GPT-2-sized vocabulary.
PRESETS = collections.OrderedDict([
    ("rnn-tiny", RNNConfig(n_layer=1, d_model=64, block_size=128, vocab_size=512, pad_vocab_to=64)),
    ("rnn-small", RNNConfig(n_layer=2, d_model=1024)),
])
