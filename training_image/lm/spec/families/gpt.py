"""The GPT family's configuration (GPT-2/3 architecture) and its arithmetic (presets: `controlplane.presets`).

The model is `lm.models.gpt`. Pure Python 3.8, no TensorFlow: imported at synth time.
"""
import dataclasses

from lm.spec.families.base import GPT3_VOCAB_SIZE, PAD_VOCAB_TO, ModelConfig, check_positive_ints


@dataclasses.dataclass(frozen=True)
class GPTConfig(ModelConfig):
    n_layer: int
    d_model: int
    n_head: int
    block_size: int = 2048
    vocab_size: int = GPT3_VOCAB_SIZE
    pad_vocab_to: int = PAD_VOCAB_TO
    dropout: float = 0.0
    tie_embeddings: bool = True
    # "pre" (GPT-2/3: LayerNorm before each sublayer, GELU) or "post" (the seed: LayerNorm
    # after each residual, ReLU); "post" exists to compare against the seed.
    norm: str = "pre"
    activation: str = "gelu"
    # The seed gave every head the full model width (key_dim = d_model); None means the
    # standard d_model // n_head.
    head_dim: int = None
    family: str = "gpt"

    def __post_init__(self):
        check_positive_ints(self, ("n_layer", "d_model", "n_head", "block_size", "vocab_size", "pad_vocab_to"))
        self._check_common("gpt")
        if self.head_dim is None and self.d_model % self.n_head:
            raise ValueError(
                "GPTConfig.d_model (%d) must be divisible by n_head (%d)" % (self.d_model, self.n_head))
        if self.norm not in ("pre", "post"):
            raise ValueError("GPTConfig.norm must be one of 'pre', 'post', got %r" % (self.norm,))
        if self.activation not in ("gelu", "relu"):
            raise ValueError("GPTConfig.activation must be one of 'gelu', 'relu', got %r" % (self.activation,))
        if self.head_dim is not None:
            check_positive_ints(self, ("head_dim",))

    @property
    def attention_head_dim(self):
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_head

    def parameter_count(self):
        d = self.d_model
        embeddings = self.padded_vocab_size * d + self.block_size * d
        head = 0 if self.tie_embeddings else self.padded_vocab_size * d
        return embeddings + self.n_layer * block_parameter_count(self) + 2 * d + head

    def non_embedding_parameter_count(self):
        return self.n_layer * block_parameter_count(self) + 2 * self.d_model

    def flops_per_token(self, seq_len=None):
        seq_len = self.block_size if seq_len is None else seq_len
        return 6 * self.non_embedding_parameter_count() + 12 * self.n_layer * self.d_model * seq_len


def block_parameter_count(config):
    """Parameters of one transformer block: attention, MLP and two LayerNorms."""
    d, inner = config.d_model, config.n_head * config.attention_head_dim
    attention = d * 3 * inner + 3 * inner + inner * d + d
    mlp = d * 4 * d + 4 * d + 4 * d * d + d
    return attention + mlp + 2 * 2 * d
