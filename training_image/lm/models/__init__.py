"""Model families ("bring your own model"): build any family's Keras model from its config.

The registry is `lm.spec.families.FAMILIES` (TF-free, so `lm.spec.job` and the CDK app read the family
names from it); each entry names its config dataclass and the "module:function" that builds the model. Every family's model maps int32 tokens [batch, seq]
to float32 logits [batch, seq, padded_vocab_size] and generates through
`decode(tokens, valid, caches=None, index=0)` (see `lm.serving.generate`).
"""
import importlib

from lm.spec.families import FAMILIES, config_from_dict, get_family, parameter_count

__all__ = ["FAMILIES", "build", "config_from_dict", "get_family", "parameter_count"]


def build(config, **options):
    """The family's Keras model for `config`, weights created; `options` go to its build function
    (`recompute` for gpt)."""
    module_name, function_name = get_family(config.family).builder.split(":")
    return getattr(importlib.import_module(module_name), function_name)(config, **options)
