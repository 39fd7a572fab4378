"""The model families: each one's config dataclass, presets, builder and capabilities.

A family is one entry of FAMILIES; its config lives in `lm.spec.families.<family>` (TF-free,
read at synth time by the control plane) and its Keras model in `lm.models.<family>` (imported
only when a model is built).

Imports nothing heavy: the CDK app and the planner use it at synth time, without TensorFlow.
"""
import collections

from lm.spec.families.base import ModelConfig, padded_vocab_size, peak_learning_rate
from lm.spec.families.gpt import PRESETS, GPTConfig, block_parameter_count
from lm.spec.families.rnn import RNN_PRESETS, RNNConfig

__all__ = ["ALL_PRESETS", "FAMILIES", "PRESETS", "RNN_PRESETS", "GPTConfig", "ModelConfig", "ModelFamily",
           "RNNConfig", "block_parameter_count", "flops_per_token", "get_family", "get_preset",
           "non_embedding_parameter_count", "padded_vocab_size", "parameter_count", "peak_learning_rate"]


class ModelFamily(collections.namedtuple("ModelFamily", "config_class presets builder")):
    """A model family: its config dataclass, its presets, and "module:function" building its
    Keras model (imported only when a model is built, so this table needs no TensorFlow)."""


# Bring your own model: one module with a build function, one config dataclass, one line here.
FAMILIES = collections.OrderedDict([
    ("gpt", ModelFamily(GPTConfig, PRESETS, "lm.models.gpt:build_model")),
    ("rnn", ModelFamily(RNNConfig, RNN_PRESETS, "lm.models.rnn:build_model")),
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


def parameter_count(config):
    """Exact trainable parameter count of the model its family builds from `config`."""
    return config.parameter_count()


def non_embedding_parameter_count(config):
    return config.non_embedding_parameter_count()


def flops_per_token(config, seq_len=None):
    """Training FLOPs per token, as used for MFU: for GPT 6N + 12*L*d*T (N without embeddings)."""
    return config.flops_per_token(seq_len)
