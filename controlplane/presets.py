"""The presets: named model configurations, data of the control plane.

A preset is a config object of a family (`lm.spec.families`), checked by its dataclass when this
module is imported. The image holds no preset: the request carries the resolved configuration to
the job as the hyperparameter `model_config` (the config's `to_dict()`), and `lm.training.train`
builds whatever valid configuration it is given. So a new preset of an existing family is one
entry here, and no image is rebuilt: `training_image/` is every image's build context, this file is
not in it. The gate (`controlplane.gate`) plans a run of any preset here and hands the job its
configuration; the state machine's definition holds no preset.

Python objects rather than a data file: each entry is checked by its family's own dataclass where it
is written, and a comment beside it gives its source.

Pure Python, no TensorFlow: imported at synth time and on a laptop.
"""
import collections
import json

from lm.spec.families import GPTConfig, LlamaConfig, RNNConfig, get_family

LLAMA3_VOCAB_SIZE = 128256  # the Llama 3 presets' vocabulary (Llama 3's tokenizer)

# GPT-3 paper (Brown et al. 2020, "Language Models are Few-Shot Learners"), Table 2.1 (n_layers,
# d_model, n_heads); context 2048 for all. `tiny` is the demo's model (the sample corpus trains it).
GPT_PRESETS = collections.OrderedDict([
    ("tiny", GPTConfig(n_layer=2, d_model=64, n_head=4, block_size=128, vocab_size=512, pad_vocab_to=64)),
    ("gpt-125m", GPTConfig(n_layer=12, d_model=768, n_head=12)),
    ("gpt-350m", GPTConfig(n_layer=24, d_model=1024, n_head=16)),
    ("gpt-760m", GPTConfig(n_layer=24, d_model=1536, n_head=16)),
    ("gpt-1.3b", GPTConfig(n_layer=24, d_model=2048, n_head=16)),
    ("gpt-2.7b", GPTConfig(n_layer=32, d_model=2560, n_head=32)),
    ("gpt-6.7b", GPTConfig(n_layer=32, d_model=4096, n_head=32)),
    ("gpt-13b", GPTConfig(n_layer=40, d_model=5120, n_head=40)),
])

# The smallest family's presets: one the demo's dataset trains, one GPT-2-sized vocabulary.
RNN_PRESETS = collections.OrderedDict([
    ("rnn-tiny", RNNConfig(n_layer=1, d_model=64, block_size=128, vocab_size=512, pad_vocab_to=64)),
    ("rnn-small", RNNConfig(n_layer=2, d_model=1024)),
])



def llama3(**shape):
    """A Llama 3 shape: its 128256-token vocabulary, 8192 positions, rope_theta 500000."""
    return LlamaConfig(block_size=8192, vocab_size=LLAMA3_VOCAB_SIZE, rope_theta=500000.0, **shape)


# Llama 3.2's rope scaling (config.json of meta-llama/Llama-3.2-1B and -3B: rope_type llama3).
LLAMA_3_2_ROPE_SCALING = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"}

# The released models' shapes, from their config.json on the Hugging Face Hub (meta-llama/Llama-3.2-1B,
# Llama-3.2-3B, Llama-2-7b-hf, Meta-Llama-3-8B, Llama-2-13b-hf); tests/model/test_llama.py checks the
# parameter counts against the totals of the Hub's safetensors. Llama 3.2's presets carry its rope
# scaling, so their positions rotate as the released models' do; they train and serve 8192 positions
# (block_size), not the 131072 of its config.json, which the planner, the dataset and the serving
# memory estimates would otherwise take as the sequence length (an imported Llama 3.2 checkpoint
# keeps its 131072).
LLAMA_PRESETS = collections.OrderedDict([
    # The demo's shape (`tiny`: vocabulary 512, context 128), two query heads per key/value head.
    ("llama-tiny", LlamaConfig(n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=176, block_size=128,
                               vocab_size=512, pad_vocab_to=64)),
    ("llama3.2-1b", llama3(n_layer=16, d_model=2048, n_head=32, n_kv_head=8, d_ff=8192, tie_embeddings=True,
                           rope_scaling=LLAMA_3_2_ROPE_SCALING)),
    ("llama3.2-3b", llama3(n_layer=28, d_model=3072, n_head=24, n_kv_head=8, d_ff=8192, tie_embeddings=True,
                           rope_scaling=LLAMA_3_2_ROPE_SCALING)),
    ("llama2-7b", LlamaConfig(n_layer=32, d_model=4096, n_head=32, n_kv_head=32, d_ff=11008)),
    ("llama3-8b", llama3(n_layer=32, d_model=4096, n_head=32, n_kv_head=8, d_ff=14336)),
    ("llama2-13b", LlamaConfig(n_layer=40, d_model=5120, n_head=40, n_kv_head=40, d_ff=13824)),
])

# Every family's presets; a family with presets is one more entry.
FAMILY_PRESETS = collections.OrderedDict([("gpt", GPT_PRESETS), ("rnn", RNN_PRESETS), ("llama", LLAMA_PRESETS)])
ALL_PRESETS = collections.OrderedDict(
    (name, config) for presets in FAMILY_PRESETS.values() for name, config in presets.items())
if len(ALL_PRESETS) != sum(len(presets) for presets in FAMILY_PRESETS.values()):
    raise ValueError("preset names must be unique across model families")
_MISPLACED = [name for family, presets in FAMILY_PRESETS.items() for name, config in presets.items()
              if not isinstance(config, get_family(family).config_class)]
if _MISPLACED:
    raise ValueError("presets %s are not configs of the family they are listed under" % _MISPLACED)


def get_preset(name, family=None):
    """The preset `name` of any family, or of `family` only when given."""
    if family is not None:
        get_family(family)  # an unknown family is an error of its own
    presets = ALL_PRESETS if family is None else FAMILY_PRESETS.get(family, {})
    try:
        return presets[name]
    except KeyError:
        raise ValueError("unknown preset %r%s; allowed: %s" % (
            name, "" if family is None else " for model %s" % family, ", ".join(presets)))


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
