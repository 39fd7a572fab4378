"""The Llama family (Llama 2 / 3 architecture): its configuration and arithmetic, its declaration and its presets.

RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query attention, no biases, an output head
of its own unless `tie_embeddings`. The model is `lm.models.llama`. Pure Python 3.8, no TensorFlow:
imported at synth time.
"""
import collections
import dataclasses

from lm.spec.families.base import PAD_VOCAB_TO, ModelConfig, ModelFamily, check_positive_ints

LLAMA2_VOCAB_SIZE = 32000
LLAMA3_VOCAB_SIZE = 128256  # the Llama 3 presets' vocabulary (Llama 3's tokenizer)
ROPE_TYPES = ("llama3",)  # the rope_scaling types lm.models.llama computes


def _rope_type_error(rope_type):
    return ValueError("LlamaConfig.rope_scaling.rope_type must be one of %s (or rope_scaling null), got %r" % (
        ", ".join(ROPE_TYPES), rope_type))


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1 and 3.2's rotary scaling, transformers' `rope_scaling` with rope_type "llama3" (the
    same fields): the frequencies whose wavelength exceeds original_max_position_embeddings /
    low_freq_factor are divided by `factor`, those below original_max_position_embeddings /
    high_freq_factor kept, those between interpolated (lm.models.llama.inverse_frequencies)."""
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self):
        field = "LlamaConfig.rope_scaling"
        if self.rope_type not in ROPE_TYPES:
            raise _rope_type_error(self.rope_type)
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError("%s.%s must be a number > 0, got %r" % (field, name, value))
        if self.factor < 1:
            raise ValueError("%s.factor must be >= 1, got %r" % (field, self.factor))
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("%s.high_freq_factor (%r) must be greater than low_freq_factor (%r)" % (
                field, self.high_freq_factor, self.low_freq_factor))
        value = self.original_max_position_embeddings
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("%s.original_max_position_embeddings must be a positive integer, got %r" % (field, value))

    @classmethod
    def from_dict(cls, values):
        """From transformers' form (rope_type, or "type" as older configs call it, and the four fields)."""
        if not isinstance(values, dict):
            raise ValueError("LlamaConfig.rope_scaling must be null or an object, got %r" % (values,))
        values = dict(values)
        if "type" in values and "rope_type" not in values:
            values["rope_type"] = values.pop("type")
        if values.get("rope_type") not in ROPE_TYPES:  # before its fields: another scaling has others
            raise _rope_type_error(values.get("rope_type"))
        known = [f.name for f in dataclasses.fields(cls)]
        unknown, missing = sorted(set(values) - set(known)), [name for name in known if name not in values]
        if unknown or missing:
            raise ValueError("LlamaConfig.rope_scaling: rope_type llama3 takes the fields %s; missing %s, unknown %s" % (
                ", ".join(known), missing, unknown))
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """Field names as in GPTConfig; transformers' LlamaConfig calls them num_hidden_layers (n_layer),
    hidden_size (d_model), num_attention_heads (n_head), num_key_value_heads (n_kv_head),
    intermediate_size (d_ff), max_position_embeddings (supported_context: block_size unless
    max_position_embeddings is above it), rope_theta, rope_scaling,
    rms_norm_eps (norm_eps) and tie_word_embeddings (tie_embeddings)."""
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int  # key/value heads, each shared by n_head // n_kv_head query heads
    d_ff: int  # width of the SwiGLU MLP's gate and up projections
    block_size: int = 4096
    vocab_size: int = LLAMA2_VOCAB_SIZE
    pad_vocab_to: int = PAD_VOCAB_TO
    dropout: float = 0.0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # Llama 2 and 3 have an output head of their own; the Llama 3.2 1B and 3B releases use the
    # embedding as the head.
    tie_embeddings: bool = False
    # None (Llama 2, Llama 3) or Llama 3.1/3.2's "llama3" scaling: a Llama3RopeScaling or its dict
    # (transformers' config.json form), which __post_init__ turns into one.
    rope_scaling: Llama3RopeScaling = None
    # The longest context the positions are made for, when it exceeds block_size (None: block_size):
    # the Llama 3.2 releases' 131072, which their rope scaling extends the 8192 original positions to.
    # config.json's max_position_embeddings (`lm.hf.llama`); transformers warns when that is not above
    # rope_scaling's original_max_position_embeddings.
    max_position_embeddings: int = None
    family: str = "llama"

    def __post_init__(self):
        check_positive_ints(self, ("n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "block_size", "vocab_size",
                                   "pad_vocab_to"))
        self.check_common()
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise ValueError("LlamaConfig.d_model (%d) must be n_head (%d) times an even head size (rotary "
                             "embeddings rotate pairs of dimensions)" % (self.d_model, self.n_head))
        if self.n_head % self.n_kv_head:
            raise ValueError("LlamaConfig.n_head (%d) must be divisible by n_kv_head (%d)" % (
                self.n_head, self.n_kv_head))
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError("LlamaConfig.%s must be a number > 0, got %r" % (name, value))
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Llama3RopeScaling):
            object.__setattr__(self, "rope_scaling", Llama3RopeScaling.from_dict(self.rope_scaling))
        if self.max_position_embeddings is not None:
            check_positive_ints(self, ("max_position_embeddings",))

    @property
    def supported_context(self):
        """The positions the model is made for: block_size, or max_position_embeddings above it."""
        return max(self.block_size, self.max_position_embeddings or 0)

    @property
    def head_dim(self):
        return self.d_model // self.n_head

    @property
    def kv_width(self):
        """The width of the keys (and of the values): n_kv_head heads of head_dim."""
        return self.n_kv_head * self.head_dim

    def block_parameter_count(self):
        """q and o projections d x d, k and v d x kv_width, SwiGLU 3 x d x d_ff, two RMSNorm weights."""
        d = self.d_model
        return 2 * d * d + 2 * d * self.kv_width + 3 * d * self.d_ff + 2 * d

    def non_embedding_parameter_count(self):
        return self.n_layer * self.block_parameter_count() + self.d_model

    def parameter_count(self):
        tables = 1 if self.tie_embeddings else 2  # the token embedding, and the output head unless tied
        return tables * self.padded_vocab_size * self.d_model + self.non_embedding_parameter_count()

    def block_matmul_parameter_count(self):
        """q and o d x d, k and v d x kv_width, the three SwiGLU matmuls d x d_ff."""
        d = self.d_model
        return 2 * d * d + 2 * d * self.kv_width + 3 * d * self.d_ff

    @property
    def attention_width(self):
        """Every query head's [t, t] products: grouped heads share keys, not the products."""
        return self.n_head * self.head_dim

    def block_activation_bytes(self, micro_batch, seq_len, compute_bytes, xla=False):
        """Bytes one block of `lm.models.llama` keeps for its backward pass, counted op by op (the
        gradient of each op reads these), with u = micro_batch * seq_len * d_model, k = the same with
        kv_width, f = with d_ff and w = micro_batch * n_head * seq_len^2 (the attention scores):
        - each RMSNorm: its float32 input (4u bytes), the normalized value and its output (2u);
        - attention: rotated queries (u), keys and values (2k), the softmax output in float32 (4w)
          and, under mixed precision, its cast copy the value matmul reads (c w), the heads' output
          the o projection reads (u);
        - SwiGLU: gate output, its silu, up output, their product (4f);
        - dropout > 0: the dropped probabilities and 1-byte masks, and the two sublayer masks
          (c w + w + 2u).
        An estimate from the ops, not yet measured against an allocator as GPT's count is
        (GPT's measured count, tests/plan, is twice the paper's); XLA is taken to keep the same."""
        u = micro_batch * seq_len * self.d_model
        k = micro_batch * seq_len * self.kv_width
        f = micro_batch * seq_len * self.d_ff
        w = micro_batch * self.n_head * seq_len * seq_len
        norms = 2 * (4 * u + 2 * compute_bytes * u)
        attention = compute_bytes * (2 * u + 2 * k) + 4 * w + (compute_bytes * w if compute_bytes != 4 else 0)
        total = norms + attention + 4 * compute_bytes * f
        if self.dropout:
            total += compute_bytes * w + w + 2 * u
        return total


# Everything but SMP (lm.distributed.smp places GPT blocks only).
FAMILY = ModelFamily(LlamaConfig, "lm.models.llama:build_model",
                     ("recompute", "kv_cache", "hf_export", "hf_import", "tgi", "lmi"), "llama")


def llama3(**shape):
    """A Llama 3 shape: its 128256-token vocabulary, 8192 positions, rope_theta 500000."""
    return LlamaConfig(block_size=8192, vocab_size=LLAMA3_VOCAB_SIZE, rope_theta=500000.0, **shape)


# Llama 3.2's rope scaling (config.json of meta-llama/Llama-3.2-1B and -3B: rope_type llama3).
LLAMA_3_2_ROPE_SCALING = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"}
LLAMA_3_2_CONTEXT = 131072  # their max_position_embeddings

# The released models' shapes, from their config.json on the Hugging Face Hub (meta-llama/Llama-3.2-1B,
# Llama-3.2-3B, Llama-2-7b-hf, Meta-Llama-3-8B, Llama-2-13b-hf); tests/model/test_llama.py checks the
# parameter counts against the totals of the Hub's safetensors. Llama 3.2's presets carry its rope
# scaling, so their positions rotate as the released models' do; they train and serve 8192 positions
# (block_size), not the 131072 of its config.json, which the planner, the dataset and the serving
# memory estimates would otherwise take as the sequence length; 131072 is their
# max_position_embeddings, the context an export declares (an imported Llama 3.2 checkpoint keeps
# 131072 as its block_size).
PRESETS = collections.OrderedDict([
    # The demo's shape (`tiny`: vocabulary 512, context 128), two query heads per key/value head.
    ("llama-tiny", LlamaConfig(n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=176, block_size=128,
                               vocab_size=512, pad_vocab_to=64)),
    ("llama3.2-1b", llama3(n_layer=16, d_model=2048, n_head=32, n_kv_head=8, d_ff=8192, tie_embeddings=True,
                           rope_scaling=LLAMA_3_2_ROPE_SCALING, max_position_embeddings=LLAMA_3_2_CONTEXT)),
    ("llama3.2-3b", llama3(n_layer=28, d_model=3072, n_head=24, n_kv_head=8, d_ff=8192, tie_embeddings=True,
                           rope_scaling=LLAMA_3_2_ROPE_SCALING, max_position_embeddings=LLAMA_3_2_CONTEXT)),
    ("llama2-7b", LlamaConfig(n_layer=32, d_model=4096, n_head=32, n_kv_head=32, d_ff=11008)),
    ("llama3-8b", llama3(n_layer=32, d_model=4096, n_head=32, n_kv_head=8, d_ff=14336)),
    ("llama2-13b", LlamaConfig(n_layer=40, d_model=5120, n_head=40, n_kv_head=40, d_ff=13824)),
])
