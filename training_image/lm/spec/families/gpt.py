"""The GPT family (GPT-2/3 architecture): its configuration and arithmetic, its declaration and its presets.

The model is `lm.models.gpt`. Pure Python 3.8, no TensorFlow: imported at synth time.
"""
import collections
import dataclasses

from lm.spec.families.base import (CAPABILITIES, GPT3_VOCAB_SIZE, PAD_VOCAB_TO, ModelConfig, ModelFamily,
                                   check_positive_ints)

# u-sized activation elements one pre-LN GELU block keeps, op by op ("graph") and under XLA
# (`GPTConfig.block_activation_bytes`; measured against TF's allocator in tests/plan).
MEASURED_U_ELEMENTS = {"graph": 34, "xla": 26}

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
        self.check_common()
        if self.head_dim is None and self.d_model % self.n_head:
            raise ValueError(
                "%s.d_model (%d) must be divisible by n_head (%d)" % (type(self).__name__, self.d_model, self.n_head))
        if self.norm not in ("pre", "post"):
            raise ValueError("%s.norm must be one of 'pre', 'post', got %r" % (type(self).__name__, self.norm))
        if self.activation not in ("gelu", "relu"):
            raise ValueError("%s.activation must be one of 'gelu', 'relu', got %r" % (type(self).__name__, self.activation))
        if self.head_dim is not None:
            check_positive_ints(self, ("head_dim",))

    @property
    def attention_head_dim(self):
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_head

    def parameter_count(self):
        d = self.d_model
        embeddings = self.padded_vocab_size * d + self.block_size * d
        head = 0 if self.tie_embeddings else self.padded_vocab_size * d
        return embeddings + self.n_layer * self.block_parameter_count() + 2 * d + head

    def non_embedding_parameter_count(self):
        return self.n_layer * self.block_parameter_count() + 2 * self.d_model

    def block_parameter_count(self):
        """Parameters of one transformer block: attention, MLP and two LayerNorms."""
        d, inner = self.d_model, self.n_head * self.attention_head_dim
        attention = d * 3 * inner + 3 * inner + inner * d + d
        mlp = d * 4 * d + 4 * d + 4 * d * d + d
        return attention + mlp + 2 * 2 * d

    def block_matmul_parameter_count(self):
        """QKV and output projections (d x 3 inner, inner x d) and the MLP's two matmuls (d x 4d, 4d x d)."""
        d, inner = self.d_model, self.n_head * self.attention_head_dim
        return 4 * d * inner + 8 * d * d

    @property
    def attention_width(self):
        return self.n_head * self.attention_head_dim

    def block_activation_bytes(self, micro_batch, seq_len, compute_bytes, xla=False):
        """Bytes one block keeps for its backward pass; u = micro_batch * seq_len * d_model,
        w = micro_batch * n_head * seq_len^2 (the attention scores).

        Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
        eq. 1 without tensor or sequence parallelism) count 34 u + 5 w bytes at 16 bit with dropout,
        i.e. 17 u elements: LayerNorm inputs 2u, QKV input u, q and k 2u, v u, projection input u,
        first MLP matmul input u, GELU input 4u, second MLP matmul input 4u, dropout masks.
        Adapted to `lm.models.gpt` and TF:
        - TF materializes the [b, h, t, t] scores; the softmax output is kept in float32 (4w)
          and, under mixed precision, again as the cast copy the value matmul reads (c w).
        - run op by op (no XLA), Keras LayerNormalization also keeps the normalized value and the
          tanh GELU its intermediates (x, tanh, 0.5 x, 1 + tanh: four 4u tensors, not one):
          MEASURED_U_ELEMENTS["graph"] = 34 u elements per block, measured (tests/plan); with
          XLA (measured on the CPU backend; GPU XLA fuses at least as much) 26 u.
        - ReLU (the seed's block) keeps its output only: 16 u fewer (not measured).
        - dropout > 0: 1-byte masks on the probabilities and both sublayer outputs, plus the
          dropped probabilities (c w + w + 2u)."""
        u = micro_batch * seq_len * self.d_model
        w = micro_batch * self.n_head * seq_len * seq_len
        elements_u = MEASURED_U_ELEMENTS["xla" if xla else "graph"] - (16 if self.activation == "relu" else 0)
        scores = 4 * w + (compute_bytes * w if compute_bytes != 4 else 0)
        total = elements_u * u * compute_bytes + scores
        if self.dropout:
            total += compute_bytes * w + w + 2 * u
        return total


# Every capability: its SMP class is lm.distributed.smp's, its Hugging Face layout GPT-2's (lm.hf).
FAMILY = ModelFamily(GPTConfig, "lm.models.gpt:build_model", tuple(CAPABILITIES), "gpt2")

# GPT-3 paper (Brown et al. 2020, "Language Models are Few-Shot Learners"), Table 2.1 (n_layers,
# d_model, n_heads, d_head); context 2048 for all. Two rows of the table are not consistent
# (n_heads x d_head != d_model), and the presets differ from them: XL (gpt-1.3b) lists 24 heads of
# 128 for d_model 2048 (24 does not divide 2048): the preset keeps d_model and d_head, so 16 heads;
# 13B lists d_model 5140 with 40 heads of 128 (40 does not divide 5140): the preset keeps the heads,
# so d_model 5120. The other five rows are the table's. `tiny` is the demo's model (the sample corpus
# trains it).
PRESETS = collections.OrderedDict([
    ("tiny", GPTConfig(n_layer=2, d_model=64, n_head=4, block_size=128, vocab_size=512, pad_vocab_to=64)),
    ("gpt-125m", GPTConfig(n_layer=12, d_model=768, n_head=12)),
    ("gpt-350m", GPTConfig(n_layer=24, d_model=1024, n_head=16)),
    ("gpt-760m", GPTConfig(n_layer=24, d_model=1536, n_head=16)),
    ("gpt-1.3b", GPTConfig(n_layer=24, d_model=2048, n_head=16)),
    ("gpt-2.7b", GPTConfig(n_layer=32, d_model=2560, n_head=32)),
    ("gpt-6.7b", GPTConfig(n_layer=32, d_model=4096, n_head=32)),
    ("gpt-13b", GPTConfig(n_layer=40, d_model=5120, n_head=40)),
])
