"""The RNN family's configuration (GRU or LSTM layers): the smallest example of a family.

The model is `lm.models.rnn`. Pure Python 3.8, no TensorFlow: imported at synth time.
"""
import dataclasses

from lm.spec.families.base import GPT3_VOCAB_SIZE, PAD_VOCAB_TO, ModelConfig, check_positive_ints


RNN_CELL_GATES = {"gru": (3, 2), "lstm": (4, 1)}  # cell -> (gates, bias vectors per gate)


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
        self._check_common("rnn")
        if self.cell not in RNN_CELL_GATES:
            raise ValueError("RNNConfig.cell must be one of %s, got %r" % (", ".join(RNN_CELL_GATES), self.cell))

    def non_embedding_parameter_count(self):
        # Keras GRU (reset_after=True) has two bias vectors per gate, LSTM one.
        gates, biases = RNN_CELL_GATES[self.cell]
        d = self.d_model
        return self.n_layer * gates * (2 * d * d + biases * d) + 2 * d

    def parameter_count(self):
        head = 0 if self.tie_embeddings else self.padded_vocab_size * self.d_model
        return self.padded_vocab_size * self.d_model + self.non_embedding_parameter_count() + head

    def flops_per_token(self, seq_len=None):
        return 6 * self.non_embedding_parameter_count()

