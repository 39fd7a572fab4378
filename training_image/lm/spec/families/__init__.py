"""The model families, found here: each is one module of this package, `lm.spec.families.<family>`,
declaring its config dataclass, its declaration `FAMILY` (a `ModelFamily`: builder and capabilities)
and its presets `PRESETS` (name -> config: data, read by the control plane and the runtime alike).
Its Keras model is `lm.models.<family>` (imported only when a model is built). Adding a family adds
a module here and its model module; this file, the preset tables and the tests are not edited.

What a family can do is declared, not assumed: its `capabilities` are names of CAPABILITIES, and
`lm.spec.job.family_rules()` turns what a family lacks into the rules every consumer reads
(`lm.spec.job.job_rules`: the Validate stage, `lmstack.start`, the planner, `lm.training.train`), each
refusing before any job starts, naming the family and the capability. A preset names its family: an
input that gives a preset and no `model` is of the preset's family (`with_preset`). This package
imports no other part of `lm.spec`: the job's tables read it, not the reverse.

Imports nothing heavy: the CDK app and the planner use it at synth time, without TensorFlow.
"""
import collections
import importlib
import pkgutil

from lm.spec.families.base import (CAPABILITIES, ModelConfig, ModelFamily, padded_vocab_size,
                                   peak_learning_rate)
from lm.spec.families.gpt import GPTConfig
from lm.spec.families.llama import LlamaConfig
from lm.spec.families.rnn import RNNConfig

__all__ = ["CAPABILITIES", "DEFAULT_FAMILY", "FAMILIES", "FAMILY_PRESETS", "GPTConfig", "LlamaConfig", "ModelConfig",
           "ModelFamily", "PRESETS", "RNNConfig", "config_from_dict", "families_with", "flops_per_token", "get_family",
           "padded_vocab_size", "parameter_count", "peak_learning_rate", "with_preset"]

DEFAULT_FAMILY = "gpt"  # the job's `model` when neither it nor a preset says otherwise (lm.spec.job)
# Modules of this package that are no family: what every family shares.
SHARED_MODULES = ("base",)


def family_modules():
    """The family modules of this package, imported: every module but SHARED_MODULES (and private
    `_` ones), the default family first, then by name."""
    names = [found.name for found in pkgutil.iter_modules(__path__)
             if found.name not in SHARED_MODULES and not found.name.startswith("_")]
    return [importlib.import_module("%s.%s" % (__name__, name))
            for name in sorted(names, key=lambda name: (name != DEFAULT_FAMILY, name))]


def _declared(module):
    """(name, ModelFamily, presets) that `module` declares; a ValueError naming what it lacks."""
    family = getattr(module, "FAMILY", None)
    if not isinstance(family, ModelFamily):
        raise ValueError("%s is a family module (every module of lm.spec.families but %s is): it must declare "
                         "FAMILY = ModelFamily(config_class, builder, capabilities, hf_model_type)" % (
                             module.__name__, ", ".join(SHARED_MODULES)))
    name = module.__name__.rpartition(".")[2]
    if family.name != name:
        raise ValueError("%s declares the family %r: a family's config has `family` = its module's name, %r" % (
            module.__name__, family.name, name))
    presets = getattr(module, "PRESETS", collections.OrderedDict())
    misplaced = [preset for preset, config in presets.items() if getattr(config, "family", None) != name]
    if misplaced:
        raise ValueError("%s.PRESETS %s are not configs of family %s" % (module.__name__, misplaced, name))
    return name, family, presets


def _registry(modules):
    """(FAMILIES, FAMILY_PRESETS, PRESETS) of the family modules; preset names are unique across families."""
    declared = [_declared(module) for module in modules]
    families = collections.OrderedDict((name, family) for name, family, _ in declared)
    family_presets = collections.OrderedDict((name, presets) for name, _, presets in declared)
    presets = collections.OrderedDict()
    for name, family_table in family_presets.items():
        for preset, config in family_table.items():
            if preset in presets:
                raise ValueError("preset %s is declared by families %s and %s: preset names are unique across "
                                 "families" % (preset, presets[preset].family, name))
            presets[preset] = config
    return families, family_presets, presets


# family name -> ModelFamily; family name -> its presets; preset name -> its config, every family's.
FAMILIES, FAMILY_PRESETS, PRESETS = _registry(family_modules())


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


def with_preset(hyperparameters):
    """The job's hyperparameters with what their `preset` implies: `model`, the preset's family, unless
    given, and `model_config`, the preset's configuration, unless given. Without a model_config,
    `preset` must name one of PRESETS and a `model` must be its family; with one it is only a label."""
    values = dict(hyperparameters)
    name = values.get("preset") or ""
    if name not in PRESETS:
        if name and values.get("model_config") is None:
            raise ValueError("hyperparameters.preset %r is not a preset and no hyperparameters.model_config is given; "
                             "allowed: %s" % (name, ", ".join(PRESETS)))
        return values
    config = PRESETS[name]
    values.setdefault("model", config.family)
    if values.get("model_config") is None:
        if values["model"] != config.family:
            raise ValueError("hyperparameters.preset %s is a preset of model %s, not of hyperparameters.model %s; "
                             "its presets: %s" % (name, config.family, values["model"],
                                                  ", ".join(FAMILY_PRESETS.get(values["model"], ()))))
        values["model_config"] = config.to_dict()
    return values


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
