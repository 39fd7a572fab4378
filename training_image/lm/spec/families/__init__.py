"""The model families: each one's config dataclass (its shape rules), builder and capabilities.

A family is one entry of FAMILIES; its config lives in `lm.spec.families.<family>` (TF-free,
read at synth time by the control plane) and its Keras model in `lm.models.<family>` (imported
only when a model is built). What a family can do is declared, not assumed: its `capabilities`
are names of CAPABILITIES, and `lm.spec.job.family_rules()` turns what a family lacks into the rules
every consumer reads (`lm.spec.job.job_rules`: the Validate stage, `lmstack.start`, the planner,
`lm.training.train`), each refusing before any job starts, naming the family and the capability.
This package imports no other part of `lm.spec`: the job's tables read it, not the reverse.
The presets, named configurations, are data of the control plane (`controlplane.presets`): a job is
given its configuration (the hyperparameter `model_config`).

Imports nothing heavy: the CDK app and the planner use it at synth time, without TensorFlow.
"""
import collections

from lm.spec.families.base import ModelConfig, padded_vocab_size, peak_learning_rate
from lm.spec.families.gpt import GPTConfig
from lm.spec.families.llama import LlamaConfig
from lm.spec.families.rnn import RNNConfig

__all__ = ["CAPABILITIES", "FAMILIES", "GPTConfig", "LlamaConfig", "ModelConfig", "ModelFamily", "RNNConfig", "config_from_dict",
           "families_with", "flops_per_token", "get_family",
           "padded_vocab_size", "parameter_count", "peak_learning_rate"]


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
    """A model family: its config dataclass, "module:function" building its Keras model (imported
    only when a model is built, so this table needs no TensorFlow), the names of the CAPABILITIES
    it has, and the Hugging Face config.json `model_type` of its layout (None without hf_export
    and hf_import). Its presets are the control plane's (`controlplane.presets`)."""

    def supports(self, capability):
        if capability not in CAPABILITIES:
            raise ValueError("unknown capability %r; allowed: %s" % (capability, ", ".join(CAPABILITIES)))
        return capability in self.capabilities


# Bring your own model: one module with a build function, one config dataclass, one line here.
FAMILIES = collections.OrderedDict([
    ("gpt", ModelFamily(GPTConfig, "lm.models.gpt:build_model", tuple(CAPABILITIES), "gpt2")),
    # No key/value cache (generation recomputes), no recompute_grad, no Hugging Face layout, no SMP class.
    ("rnn", ModelFamily(RNNConfig, "lm.models.rnn:build_model", (), None)),
    # No SMP v1 class (lm.distributed.smp places GPT blocks only).
    ("llama", ModelFamily(LlamaConfig, "lm.models.llama:build_model",
                          ("recompute", "kv_cache", "hf_export", "hf_import", "tgi", "lmi"), "llama")),
])


def check_declaration(name, family):
    """A family's declaration is consistent: known capabilities, a Hugging Face model_type exactly
    where it reads or writes that layout, and the serving containers only on its export."""
    unknown = sorted(set(family.capabilities) - set(CAPABILITIES))
    if unknown:
        raise ValueError("family %s declares unknown capabilities %s; allowed: %s" % (
            name, unknown, ", ".join(CAPABILITIES)))
    if bool(family.hf_model_type) != bool({"hf_export", "hf_import"} & set(family.capabilities)):
        raise ValueError("family %s: hf_model_type (its Hugging Face config.json model_type) is given exactly "
                         "when it declares hf_export or hf_import" % name)
    for container in ("tgi", "lmi"):
        if family.supports(container) and not family.supports("hf_export"):
            raise ValueError("family %s: %s serves the Hugging Face export, which needs hf_export" % (name, container))


for _name, _family in FAMILIES.items():
    check_declaration(_name, _family)


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


def flops_per_token(config, seq_len=None):
    """Training FLOPs per token at `seq_len`: 6 x (the blocks' matmul weights + the output projection)
    + 12 x n_layer x seq_len x attention width (`ModelConfig.flops_per_token`). The one count behind
    the planner's time, the MFU the training log reports and bench/gpu.py's."""
    return config.flops_per_token(seq_len)


def families_with(capability):
    return [name for name, family in FAMILIES.items() if family.supports(capability)]


def capability_message(family, asked, capability):
    """"model rnn cannot use strategy smp (capability smp: ...); families with it: gpt"."""
    having = families_with(capability)
    return "model %s cannot use %s (capability %s: %s); %s" % (
        family, asked, capability, CAPABILITIES[capability],
        "families with it: %s" % ", ".join(having) if having else "no family has it")
