"""The model families: each one's config dataclass (its shape rules), builder and capabilities.

A family is one entry of FAMILIES; its config lives in `lm.spec.families.<family>` (TF-free,
read at synth time by the control plane) and its Keras model in `lm.models.<family>` (imported
only when a model is built). The presets, named configurations, are data of the control plane
(`controlplane.presets`): a job is given its configuration (the hyperparameter `model_config`).

Imports nothing heavy: the CDK app and the planner use it at synth time, without TensorFlow.
"""
import collections

from lm.spec.families.base import ModelConfig, padded_vocab_size, peak_learning_rate
from lm.spec.families.gpt import GPTConfig, block_parameter_count
from lm.spec.families.rnn import RNNConfig

__all__ = ["FAMILIES", "GPTConfig", "ModelConfig", "ModelFamily", "RNNConfig", "block_parameter_count",
           "config_from_dict", "flops_per_token", "get_family", "non_embedding_parameter_count",
           "padded_vocab_size", "parameter_count", "peak_learning_rate"]


class ModelFamily(collections.namedtuple("ModelFamily", "config_class builder")):
    """A model family: its config dataclass and "module:function" building its Keras model
    (imported only when a model is built, so this table needs no TensorFlow)."""


# Bring your own model: one module with a build function, one config dataclass, one line here.
FAMILIES = collections.OrderedDict([
    ("gpt", ModelFamily(GPTConfig, "lm.models.gpt:build_model")),
    ("rnn", ModelFamily(RNNConfig, "lm.models.rnn:build_model")),
])


def get_family(name):
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError("unknown model family %r; allowed: %s" % (name, ", ".join(FAMILIES)))


def config_from_dict(family, values):
    """The config of `family` from its `to_dict()` form (the hyperparameter `model_config`): its
    dataclass checks every field; unknown families or fields are an error."""
    return get_family(family).config_class.from_dict(values)


def parameter_count(config):
    """Exact trainable parameter count of the model its family builds from `config`."""
    return config.parameter_count()


def non_embedding_parameter_count(config):
    return config.non_embedding_parameter_count()


def flops_per_token(config, seq_len=None):
    """Training FLOPs per token, as used for MFU: for GPT 6N + 12*L*d*T (N without embeddings)."""
    return config.flops_per_token(seq_len)
