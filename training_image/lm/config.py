"""Model configurations and the arithmetic on them (parameters, FLOPs).

Imports nothing heavy: the CDK app and `lm.plan` use it at synth time, without TensorFlow.
"""
import dataclasses
from typing import Dict

GPT3_VOCAB_SIZE = 50257
PAD_VOCAB_TO = 128


def padded_vocab_size(vocab_size, multiple=PAD_VOCAB_TO):
    """Round the vocabulary up so the output matmul tiles evenly (50257 -> 50304)."""
    return -(-vocab_size // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class GPTConfig:
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
        for name in ("n_layer", "d_model", "n_head", "block_size", "vocab_size", "pad_vocab_to"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError("GPTConfig.%s must be a positive integer, got %r" % (name, value))
        if self.head_dim is None and self.d_model % self.n_head:
            raise ValueError(
                "GPTConfig.d_model (%d) must be divisible by n_head (%d)" % (self.d_model, self.n_head))
        if self.norm not in ("pre", "post"):
            raise ValueError("GPTConfig.norm must be one of 'pre', 'post', got %r" % (self.norm,))
        if self.activation not in ("gelu", "relu"):
            raise ValueError("GPTConfig.activation must be one of 'gelu', 'relu', got %r" % (self.activation,))
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("GPTConfig.dropout must be in [0, 1), got %r" % (self.dropout,))

    @property
    def padded_vocab_size(self):
        return padded_vocab_size(self.vocab_size, self.pad_vocab_to)

    @property
    def attention_head_dim(self):
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_head

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError("unknown GPTConfig fields %s; allowed: %s" % (unknown, sorted(known)))
        return cls(**values)


# GPT-3 paper, Table 2.1 (n_layers, d_model, n_heads); context 2048 for all.
PRESETS = {
    "tiny": GPTConfig(n_layer=2, d_model=64, n_head=4, block_size=128, vocab_size=512, pad_vocab_to=64),
    "gpt-125m": GPTConfig(n_layer=12, d_model=768, n_head=12),
    "gpt-350m": GPTConfig(n_layer=24, d_model=1024, n_head=16),
    "gpt-760m": GPTConfig(n_layer=24, d_model=1536, n_head=16),
    "gpt-1.3b": GPTConfig(n_layer=24, d_model=2048, n_head=16),
    "gpt-2.7b": GPTConfig(n_layer=32, d_model=2560, n_head=32),
    "gpt-6.7b": GPTConfig(n_layer=32, d_model=4096, n_head=32),
    "gpt-13b": GPTConfig(n_layer=40, d_model=5120, n_head=40),
}  # type: Dict[str, GPTConfig]


def get_preset(name):
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError("unknown preset %r; allowed: %s" % (name, ", ".join(PRESETS)))


def block_parameter_count(config):
    """Parameters of one transformer block: attention, MLP and two LayerNorms."""
    d, inner = config.d_model, config.n_head * config.attention_head_dim
    attention = d * 3 * inner + 3 * inner + inner * d + d
    mlp = d * 4 * d + 4 * d + 4 * d * d + d
    return attention + mlp + 2 * 2 * d


def parameter_count(config):
    """Exact trainable parameter count of `lm.model.build_model(config)`."""
    d = config.d_model
    embeddings = config.padded_vocab_size * d + config.block_size * d
    head = 0 if config.tie_embeddings else config.padded_vocab_size * d
    return embeddings + config.n_layer * block_parameter_count(config) + 2 * d + head


def non_embedding_parameter_count(config):
    return config.n_layer * block_parameter_count(config) + 2 * config.d_model


def flops_per_token(config, seq_len=None):
    """Training FLOPs per token, 6N + 12*L*d*T (N without embeddings), as used for MFU."""
    seq_len = config.block_size if seq_len is None else seq_len
    return 6 * non_embedding_parameter_count(config) + 12 * config.n_layer * config.d_model * seq_len
