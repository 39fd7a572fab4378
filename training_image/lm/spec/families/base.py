"""What every family shares: the capabilities it may declare, its declaration (`ModelFamily`), its
config's base class, and the learning-rate default every family starts from.

A family module (`lm.spec.families.<family>`) imports from here, never from the registry
(`lm.spec.families`), which imports the family modules.

Imports nothing heavy: the CDK app and the planner use it at synth time, without TensorFlow.
"""
import collections
import dataclasses
import math

GPT3_VOCAB_SIZE = 50257
PAD_VOCAB_TO = 128


# What a family may declare: name -> what it means. A consumer of a capability reads the
# declaration (`ModelFamily.supports`), never the family's name.
CAPABILITIES = collections.OrderedDict([
    ("smp", "SMP v1 placement: the model can be an smp.DistributedModel (lm.distributed.smp)"),
    ("recompute", "activation recomputation in the backward pass (hyperparameters.recompute)"),
    ("kv_cache", "incremental decoding with a key/value cache (lm.serving.generate, our server); "
                 "without it generation recomputes the whole sequence at every token"),
    ("hf_export", "writes the Hugging Face layout (hyperparameters.export_hf, python -m lm.hf --format hf)"),
    ("hf_import", "reads the Hugging Face layout (init_from, python -m lm.hf --from-hf)"),
    ("tgi", "served by Hugging Face TGI from its Hugging Face export (deploy.container tgi)"),
    ("lmi", "served by AWS LMI (vLLM) from its Hugging Face export (deploy.container lmi)"),
])


class ModelFamily(collections.namedtuple("ModelFamily", "config_class builder capabilities hf_model_type")):
    """A model family's declaration, the `FAMILY` of its module: its config dataclass (whose `family`
    default is the family's name), "module:function" building its Keras model (imported only when a
    model is built, so this needs no TensorFlow), the names of the CAPABILITIES it has, and the
    Hugging Face config.json `model_type` of its layout (None without hf_export and hf_import)."""

    @property
    def name(self):
        return self.config_class.family

    def supports(self, capability):
        if capability not in CAPABILITIES:
            raise ValueError("unknown capability %r; allowed: %s" % (capability, ", ".join(CAPABILITIES)))
        return capability in self.capabilities


def padded_vocab_size(vocab_size, multiple=PAD_VOCAB_TO):
    """Round the vocabulary up so the output matmul tiles evenly (50257 -> 50304)."""
    return -(-vocab_size // multiple) * multiple


def check_positive_ints(config, names):
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError("%s.%s must be a positive integer, got %r" % (type(config).__name__, name, value))


class ModelConfig:
    """What every family's config dataclass shares: a `family` field, a padded vocabulary,
    dict round trips, and the sizes `controlplane.planner` and the MFU figures use.

    The interface the planner reads (it reads no family's own fields; a new family implements it):
    - fields n_layer (the blocks stacked), d_model (the width of what flows between them: a block's
      input is micro_batch x seq_len x d_model), block_size (the context), vocab_size, dropout;
    - parameter_count(): exact trainable parameters of the model the family builds;
      non_embedding_parameter_count(); block_parameter_count(): one of the n_layer blocks (what
      an SMP partition holds besides the rest, parameter_count() - n_layer x block);
    - block_matmul_parameter_count(): the weights of one block's matmuls (no norms, no biases) and
      attention_width: the width the [t, t] attention products run over (query heads x head size;
      0 without attention): the shape the one FLOPs count (`flops_per_token`, here) is made of;
    - block_activation_bytes(micro_batch, seq_len, compute_bytes, xla=False): the bytes one
      block keeps for its backward pass (attention scores included where it has them)."""

    attention_width = 0  # a family with attention overrides it

    @property
    def padded_vocab_size(self):
        return padded_vocab_size(self.vocab_size, self.pad_vocab_to)

    def output_projection_parameter_count(self):
        """The output layer's matmul: d_model x the padded vocabulary (the rows the model computes),
        whether its weights are the embedding's (tied) or its own."""
        return self.d_model * self.padded_vocab_size

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token at `seq_len` (default block_size): the one count the planner's time,
        the MFU lm.training.train logs and bench/gpu.py's MFU use.

        6 x (the blocks' matmul weights + the output projection, once, tied or not)
        + 12 x n_layer x seq_len x attention_width: 2 FLOPs per weight and token forward, twice that
        backward; the attention's two [t, t] products, forward and backward (PaLM, Chowdhery et al.
        2022, appendix B: 6N + 12LHQT; the output projection over the padded vocabulary as
        Megatron-LM's num_floating_point_operations counts it). Embedding lookups, norms, biases and
        the softmax are not counted. Equal, per token, to what a training step's matmuls execute
        (`controlplane.planner.step_flops`, checked against the traced graph in tests/plan)."""
        seq_len = self.block_size if seq_len is None else seq_len
        matmul_weights = self.n_layer * self.block_matmul_parameter_count() + self.output_projection_parameter_count()
        return 6 * matmul_weights + 12 * self.n_layer * seq_len * self.attention_width

    def block_forward_flops(self, batch, seq_len):
        """The matmul FLOPs one block's forward pass executes on `batch` sequences: 2 per matmul weight
        and token, and the [t, t] attention products (scores and weighted sum) over attention_width."""
        tokens = batch * seq_len
        return 2 * tokens * self.block_matmul_parameter_count() + 4 * tokens * seq_len * self.attention_width

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        """The config of `values` (its `to_dict()` form); the dataclass checks each value."""
        fields = dataclasses.fields(cls)
        if not isinstance(values, dict):
            raise ValueError("a %s must be a JSON object, got %r" % (cls.__name__, values))
        known = {f.name for f in fields}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError("unknown %s fields %s; allowed: %s" % (cls.__name__, unknown, sorted(known)))
        missing = [f.name for f in fields if f.name not in values
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError("%s needs the fields %s" % (cls.__name__, missing))
        return cls(**values)

    # The family this config is of: a dataclass field whose default is the family's name (a derived
    # family's config redeclares it, `family: str = "gptj"`); `check_common` holds every config to it.
    family = None

    def check_common(self):
        """The checks every config's __post_init__ runs: its `family` is its class's, dropout in [0, 1)."""
        declared = type(self).family
        if self.family != declared:
            raise ValueError("%s.family must be %r, got %r" % (type(self).__name__, declared, self.family))
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("%s.dropout must be in [0, 1), got %r" % (type(self).__name__, self.dropout))


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
    parameter count with (by ratio; the GPT presets are Table 2.1's sizes, the smaller
    models get GPT-3 Small's)."""
    params = config.parameter_count()
    _, batch, rate = min(GPT3_TRAINING, key=lambda row: abs(math.log(row[0] / params)))
    return rate, batch


def peak_learning_rate(config, global_batch_size, learning_rate=0.0, scale_lr=False):
    """The peak learning rate a run uses: `learning_rate`, or where it is 0 the rate GPT-3 trained
    this size with (`gpt3_training`).

    By default the rate is kept whatever the batch. With Adam the step size hardly depends on the
    gradient's scale, and published runs keep GPT-3's per-size rates at other batches: Pythia
    (Biderman et al. 2023) trained every size from 70M to 12B at 1,024 sequences of 2,048 tokens
    with GPT-3's rates (6e-4 at 125M: four times GPT-3's batch for that size; 2e-4 at 1.3B).
    Linear scaling, the rule for SGD, took gpt-1.3b at 64 sequences to 2.5e-5, 8x below.

    `scale_lr`: the square-root rule for Adam (Malladi et al. 2022, "On the SDEs and Scaling Rules for
    Adaptive Gradient Algorithms": batch x k, rate x sqrt(k)) from GPT-3's batch for the size to
    global_batch_size, downwards only: a larger batch never raises the rate above the one GPT-3
    found stable for the size."""
    rate, batch = gpt3_training(config)
    rate = learning_rate or rate
    return rate * math.sqrt(min(1.0, global_batch_size / float(batch))) if scale_lr else rate
