"""Model configurations and the arithmetic on them (parameters, FLOPs).

Imports nothing heavy: the CDK app and `lm.plan` use it at synth time, without TensorFlow.
"""
import collections
import dataclasses
from typing import Dict

GPT3_VOCAB_SIZE = 50257
PAD_VOCAB_TO = 128


def padded_vocab_size(vocab_size, multiple=PAD_VOCAB_TO):
    """Round the vocabulary up so the output matmul tiles evenly (50257 -> 50304)."""
    return -(-vocab_size // multiple) * multiple


def _check_positive_ints(config, names):
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError("%s.%s must be a positive integer, got %r" % (type(config).__name__, name, value))


class _ModelConfig:
    """What every family's config dataclass shares: a `family` field, a padded vocabulary,
    dict round trips, and the sizes `lm.plan` and the MFU figures use."""

    @property
    def padded_vocab_size(self):
        return padded_vocab_size(self.vocab_size, self.pad_vocab_to)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError("unknown %s fields %s; allowed: %s" % (cls.__name__, unknown, sorted(known)))
        return cls(**values)

    def _check_common(self, family):
        if self.family != family:
            raise ValueError("%s.family must be %r, got %r" % (type(self).__name__, family, self.family))
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("%s.dropout must be in [0, 1), got %r" % (type(self).__name__, self.dropout))


@dataclasses.dataclass(frozen=True)
class GPTConfig(_ModelConfig):
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
        _check_positive_ints(self, ("n_layer", "d_model", "n_head", "block_size", "vocab_size", "pad_vocab_to"))
        self._check_common("gpt")
        if self.head_dim is None and self.d_model % self.n_head:
            raise ValueError(
                "GPTConfig.d_model (%d) must be divisible by n_head (%d)" % (self.d_model, self.n_head))
        if self.norm not in ("pre", "post"):
            raise ValueError("GPTConfig.norm must be one of 'pre', 'post', got %r" % (self.norm,))
        if self.activation not in ("gelu", "relu"):
            raise ValueError("GPTConfig.activation must be one of 'gelu', 'relu', got %r" % (self.activation,))
        if self.head_dim is not None:
            _check_positive_ints(self, ("head_dim",))

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


# GPT-3 paper, Table 2.1 (n_layers, d_model, n_heads); context 2048 for all.
PRESETS: Dict[str, GPTConfig] = {
    "tiny": GPTConfig(n_layer=2, d_model=64, n_head=4, block_size=128, vocab_size=512, pad_vocab_to=64),
    "gpt-125m": GPTConfig(n_layer=12, d_model=768, n_head=12),
    "gpt-350m": GPTConfig(n_layer=24, d_model=1024, n_head=16),
    "gpt-760m": GPTConfig(n_layer=24, d_model=1536, n_head=16),
    "gpt-1.3b": GPTConfig(n_layer=24, d_model=2048, n_head=16),
    "gpt-2.7b": GPTConfig(n_layer=32, d_model=2560, n_head=32),
    "gpt-6.7b": GPTConfig(n_layer=32, d_model=4096, n_head=32),
    "gpt-13b": GPTConfig(n_layer=40, d_model=5120, n_head=40),
}


# GPT-3 paper (Brown et al. 2020, "Language Models are Few-Shot Learners"), Table 2.1: the
# learning rate each size was trained with and its batch, in sequences of 2,048 tokens (0.5M
# tokens = 256, 1M = 512, 2M = 1024, 3.2M = 1536 sequences). (parameters, batch, learning rate)
GPT3_TRAINING = (
    (125e6, 256, 6.0e-4),    # GPT-3 Small
    (350e6, 256, 3.0e-4),    # Medium
    (760e6, 256, 2.5e-4),    # Large
    (1.3e9, 512, 2.0e-4),    # XL
    (2.7e9, 512, 1.6e-4),    # 2.7B
    (6.7e9, 1024, 1.2e-4),   # 6.7B
    (13.0e9, 1024, 1.0e-4),  # 13B
    (175.0e9, 1536, 0.6e-4),  # 175B
)


def gpt3_training(config):
    """(learning rate, batch in sequences) GPT-3 trained the size nearest to `config`'s
    parameter count with (by ratio; the GPT presets are Table 2.1's shapes, the smaller
    models get GPT-3 Small's)."""
    import math

    params = parameter_count(config)
    _, batch, rate = min(GPT3_TRAINING, key=lambda row: abs(math.log(row[0] / params)))
    return rate, batch


def peak_learning_rate(config, global_batch_size, learning_rate=0.0, scale_lr=True):
    """The peak learning rate a run uses. `learning_rate` 0: GPT-3's rate for this size
    (`gpt3_training`), else the given one; both are rates for GPT-3's batch of that size. With
    `scale_lr` the rate scales linearly with global_batch_size / that batch, bounded by 1:
    a smaller batch takes proportionally smaller steps, a larger one never more than the rate
    GPT-3 found stable for the size (linear scaling past it is what made gpt-6.7b's rate at a
    1M-token batch ten times GPT-3's)."""
    rate, batch = gpt3_training(config)
    rate = learning_rate or rate
    return rate * min(1.0, global_batch_size / float(batch)) if scale_lr else rate


RNN_CELL_GATES = {"gru": (3, 2), "lstm": (4, 1)}  # cell -> (gates, bias vectors per gate)


@dataclasses.dataclass(frozen=True)
class RNNConfig(_ModelConfig):
    """The second family (`lm.rnn`): token embedding, n_layer GRU or LSTM layers, final
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
        _check_positive_ints(self, ("n_layer", "d_model", "block_size", "vocab_size", "pad_vocab_to"))
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


RNN_PRESETS: Dict[str, RNNConfig] = {
    "rnn-tiny": RNNConfig(n_layer=1, d_model=64, block_size=128, vocab_size=512, pad_vocab_to=64),
    "rnn-small": RNNConfig(n_layer=2, d_model=1024),
}


class ModelFamily(collections.namedtuple("ModelFamily", "config_class presets builder")):
    """A model family: its config dataclass, its presets, and "module:function" building its
    Keras model (imported only when a model is built, so this table needs no TensorFlow)."""


# Bring your own model: one module with a build function, one config dataclass, one line here.
FAMILIES = collections.OrderedDict([
    ("gpt", ModelFamily(GPTConfig, PRESETS, "lm.model:build_model")),
    ("rnn", ModelFamily(RNNConfig, RNN_PRESETS, "lm.rnn:build_model")),
])
ALL_PRESETS = collections.OrderedDict(
    (name, config) for family in FAMILIES.values() for name, config in family.presets.items())
if len(ALL_PRESETS) != sum(len(f.presets) for f in FAMILIES.values()):
    raise ValueError("preset names must be unique across model families")


def get_family(name):
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError("unknown model family %r; allowed: %s" % (name, ", ".join(FAMILIES)))


def get_preset(name, family=None):
    """The preset `name` of any family, or of `family` only when given."""
    presets = ALL_PRESETS if family is None else get_family(family).presets
    try:
        return presets[name]
    except KeyError:
        raise ValueError("unknown preset %r%s; allowed: %s" % (
            name, "" if family is None else " for model %s" % family, ", ".join(presets)))


def block_parameter_count(config):
    """Parameters of one transformer block: attention, MLP and two LayerNorms."""
    d, inner = config.d_model, config.n_head * config.attention_head_dim
    attention = d * 3 * inner + 3 * inner + inner * d + d
    mlp = d * 4 * d + 4 * d + 4 * d * d + d
    return attention + mlp + 2 * 2 * d


def parameter_count(config):
    """Exact trainable parameter count of the model its family builds from `config`."""
    return config.parameter_count()


def non_embedding_parameter_count(config):
    return config.non_embedding_parameter_count()


def flops_per_token(config, seq_len=None):
    """Training FLOPs per token, as used for MFU: for GPT 6N + 12*L*d*T (N without embeddings)."""
    return config.flops_per_token(seq_len)
