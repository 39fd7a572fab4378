"""The presets, named model configurations, as the control plane uses them.

A preset is data of its family, beside the family's config (`lm.spec.families.<family>.PRESETS`,
checked by its dataclass when the registry is imported; `lm.spec.families.PRESETS` holds every
family's). The request still carries the resolved configuration to the job as the hyperparameter
`model_config` (the config's `to_dict()`), and `lm.training.train` builds whatever valid configuration
it is given, or resolves `preset` itself when it is given none. The gate (`controlplane.gate`) plans a
run of any preset and hands the job its configuration; the state machine's definition holds no preset.

Pure Python, no TensorFlow: imported at synth time and on a laptop.
"""
import collections
import json

from lm.spec.families import FAMILY_PRESETS, PRESETS, get_family

__all__ = ["ALL_PRESETS", "FAMILY_PRESETS", "GPT_PRESETS", "get_preset", "model_config", "preset_family", "resolve",
           "train_arguments"]

ALL_PRESETS = PRESETS  # every family's presets, preset name -> config (the registry's table itself)
GPT_PRESETS = FAMILY_PRESETS["gpt"]  # the default family's (lm.spec.families.DEFAULT_FAMILY)


def get_preset(name, family=None):
    """The preset `name` of any family, or of `family` only when given."""
    if family is not None:
        get_family(family)  # an unknown family is an error of its own
    presets = ALL_PRESETS if family is None else FAMILY_PRESETS[family]
    try:
        return presets[name]
    except KeyError:
        raise ValueError("unknown preset %r%s; allowed: %s" % (
            name, "" if family is None else " for model %s" % family, ", ".join(presets)))


def preset_family(name):
    """The family preset `name` is a configuration of: the `model` an input that names it implies."""
    return get_preset(name).family


def model_config(preset):
    """The hyperparameter `model_config` of a preset: its configuration (`to_dict()`) as JSON text.

    Text, not an object: the SageMaker training toolkit passes a hyperparameter that decodes to an
    object on the command line as `k=v,k=v` (sagemaker_training.mapping.to_cmd_args), a string as it
    is; `lm.training.train` decodes the text."""
    return json.dumps(get_preset(preset).to_dict(), separators=(",", ":"))


def resolve(hyperparameters):
    """`lm.training.train`'s values with the preset resolved: `model_config` added (unless given),
    `preset` kept as its label (logs, MLflow). Local runs (tests, bench, the demo) start a job so."""
    values = collections.OrderedDict(hyperparameters)
    if "model_config" not in values:
        values["model_config"] = model_config(values["preset"])
    return values


def train_arguments(preset):
    """`python -m lm.training.train`'s arguments for `preset`: its label and its configuration."""
    return ["--preset", preset, "--model_config", json.dumps(model_config(preset))]
