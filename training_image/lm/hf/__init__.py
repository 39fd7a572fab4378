"""Hugging Face directories: write one from our export, or read one into our format.

Each layout is a module of this package (`lm.hf.gpt2`: GPT2LMHeadModel, `lm.hf.llama`:
LlamaForCausalLM), found through the family declarations (`lm.spec.families`): a family that
declares hf_export or hf_import names its layout's config.json `model_type` (hf_model_type), and a
directory's model_type picks the family it imports as. A directory holds:

    config.json             the layout's config (model_type, shape, torch_dtype, the lmstack padding note)
    model.safetensors       the PyTorch state dict's tensor names and layout, in the layout's dtype
                            (GPT-2 float32, Llama bfloat16, as published) or the one asked for; above
                            max_shard_size (5GB) shards model-0000k-of-0000n.safetensors and
                            model.safetensors.index.json, as transformers writes them
    generation_config.json  bos/eos = the end-of-document token
    tokenizer.json          our tokenizers file, unchanged (same ids)
    tokenizer_config.json   the layout's fast tokenizer class with the end-of-document token as eos

Padded vocabulary rows are cut: the HF vocab_size is the model's real vocab_size (the logits of
real tokens are unchanged), and config.json keeps the padded size under "lmstack".
Imported checkpoints get pad_vocab_to=1, so the softmax runs over the same rows as in
transformers and the loss is the same.

safetensors is written and read by `lm.hf.files`, from its specification, one tensor at a time (no
second copy of the model in memory): the training image needs neither `transformers` nor
`safetensors`. Imports read float32, float16, bfloat16 and float64 tensors, single files and shards,
into float32 variables (the weights lmstack trains, in every precision).
"""
import collections
import json
import os
import shutil

from lm import models
from lm.tokenizer import EOD_TOKEN, eod_id
from lm.hf import gpt2, llama
from lm.hf.files import (DEFAULT_MAX_SHARD_SIZE, EXPORT_DTYPES, HFError, assign, check_dtype, checkpoint_tensors,
                         parse_size, read_safetensors, write_checkpoint, write_safetensors)
from lm.serving import export as lm_export
from lm.spec.families import FAMILIES, capability_message, families_with, get_family

__all__ = ["DEFAULT_MAX_SHARD_SIZE", "EXPORT_DTYPES", "HFError", "LAYOUTS", "check_same_tokenizer", "dataset_tokenizer",
           "export_hf", "family_layout", "import_hf", "init_config", "load_hf", "load_weights", "read_safetensors", "write_hf",
           "write_safetensors"]

HF_CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# config.json model_type -> its layout; a family declares the model_type of its own.
LAYOUTS = collections.OrderedDict((layout.model_type, layout) for layout in (gpt2.LAYOUT, llama.LAYOUT))


def family_layout(family, capability="hf_export"):
    """The Hugging Face layout model family `family` declares; HFError when it lacks `capability`."""
    declared = get_family(family)
    if not declared.supports(capability):
        raise HFError(capability_message(family, "the Hugging Face %s" % (
            "export" if capability == "hf_export" else "import"), capability))
    return LAYOUTS[declared.hf_model_type]


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


def export_hf(export_dir, output_dir, dtype=None, max_shard_size=DEFAULT_MAX_SHARD_SIZE):
    """Write the Hugging Face directory of an `lm.serving.export` directory; returns output_dir."""
    model, config, _ = lm_export.load_exported(export_dir)
    return write_hf(model, config, os.path.join(export_dir, lm_export.TOKENIZER_FILE), output_dir, dtype,
                    max_shard_size)


def write_hf(model, config, tokenizer_file, output_dir, dtype=None, max_shard_size=DEFAULT_MAX_SHARD_SIZE):
    """Write the Hugging Face files of a model in its family's layout, its weights in `dtype`
    (EXPORT_DTYPES; None: the layout's, as the family's models are published) in shards of at most
    `max_shard_size` where they are larger; `output_dir` may be the `lm.serving.export` directory
    itself (lm.training.train's export_hf): no file name is shared but tokenizer.json, which is the
    same file."""
    from tokenizers import Tokenizer

    layout = family_layout(config.family)
    layout.check(config)
    dtype = check_dtype(dtype or layout.export_dtype)
    parse_size(max_shard_size)  # a bad size fails before any file is written
    tokenizer = Tokenizer.from_file(tokenizer_file)
    eos = eod_id(tokenizer, EOD_TOKEN, tokenizer_file)
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise HFError("%s: tokenizer has %d tokens but the model's vocab_size is %d" % (
            tokenizer_file, tokenizer.get_vocab_size(), config.vocab_size))
    os.makedirs(output_dir, exist_ok=True)
    write_checkpoint(layout.export_tensors(model, config), output_dir, dtype, max_shard_size)
    _write_json(os.path.join(output_dir, HF_CONFIG_FILE), layout.hf_config(config, eos, dtype))
    _write_json(os.path.join(output_dir, GENERATION_CONFIG_FILE),
                {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos})
    target = os.path.join(output_dir, lm_export.TOKENIZER_FILE)
    if not (os.path.exists(target) and os.path.samefile(tokenizer_file, target)):
        shutil.copyfile(tokenizer_file, target)
    _write_json(os.path.join(output_dir, TOKENIZER_CONFIG_FILE), {
        "tokenizer_class": layout.tokenizer_class, "model_max_length": config.block_size,
        "add_prefix_space": False, "bos_token": EOD_TOKEN, "eos_token": EOD_TOKEN, "unk_token": EOD_TOKEN})
    return output_dir


def _config_values(hf_dir):
    path = os.path.join(hf_dir, HF_CONFIG_FILE)
    try:
        with open(path) as f:
            return path, json.load(f)
    except (OSError, ValueError) as error:
        raise HFError("%s: cannot read: %s" % (path, error))


def _read_hf_config(hf_dir):
    """(config.json's path, its values, our config of it in the layout its model_type names)."""
    path, values = _config_values(hf_dir)
    importing = [name for name in families_with("hf_import") if FAMILIES[name].hf_model_type == values.get("model_type")]
    if not importing:
        raise HFError("%s: model_type %r; the families that import a Hugging Face layout read model_type %s" % (
            path, values.get("model_type"), ", ".join("%r (model %s)" % (FAMILIES[name].hf_model_type, name)
                                                      for name in families_with("hf_import"))))
    return path, values, LAYOUTS[values["model_type"]].read_config(path, values)


def hf_tokenizer_file(hf_dir):
    tokenizer_file = os.path.join(hf_dir, lm_export.TOKENIZER_FILE)
    if not os.path.isfile(tokenizer_file):
        raise HFError("%s: not found; the import needs the fast tokenizer file" % tokenizer_file)
    return tokenizer_file


def dataset_tokenizer(hf_dir, eod_token=EOD_TOKEN):
    """(tokenizer.json, the end-of-document token) to tokenize a dataset with for the checkpoint in
    `hf_dir` (lm.data.prepare --init-from): the token of config.json's eos_token_id (`eod_token` when it
    names none); the tokenizer must fit the vocab_size config.json gives the model."""
    from tokenizers import Tokenizer

    path, values, config = _read_hf_config(hf_dir)
    tokenizer_file = hf_tokenizer_file(hf_dir)
    tokenizer = Tokenizer.from_file(tokenizer_file)
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise HFError("%s has %d tokens, more than the vocab_size %d of %s" % (
            tokenizer_file, tokenizer.get_vocab_size(), config.vocab_size, path))
    eos_id = values.get("eos_token_id")
    if eos_id is None:
        return tokenizer_file, eod_token
    token = tokenizer.id_to_token(eos_id) if isinstance(eos_id, int) and not isinstance(eos_id, bool) else None
    if token is None:
        raise HFError("%s: eos_token_id %r is not a token id of %s" % (path, eos_id, tokenizer_file))
    return tokenizer_file, token


def import_hf(hf_dir, export_dir):
    """Write an `lm.serving.export` directory from a Hugging Face directory (config.json,
    model.safetensors or its shards, tokenizer.json) of a layout a family imports; returns export_dir."""
    _, _, config = _read_hf_config(hf_dir)
    tokenizer_file = hf_tokenizer_file(hf_dir)
    model = load_weights(models.build(config), hf_dir)
    return lm_export.export_model(model, config, tokenizer_file, export_dir)


def load_hf(hf_dir):
    """(model, config, tokenizer, end-of-document token) of a Hugging Face directory, in memory
    (lm.eval evaluates one without writing an export)."""
    from tokenizers import Tokenizer

    _, _, config = _read_hf_config(hf_dir)
    tokenizer_file, eod_token = dataset_tokenizer(hf_dir)
    return load_weights(models.build(config), hf_dir), config, Tokenizer.from_file(tokenizer_file), eod_token


def init_config(hf_dir, preset_config, label):
    """The config to train from the checkpoint in `hf_dir` (lm.training.train's init_from): its
    model_type must be the Hugging Face layout the configuration's family declares, its shape (the
    layout's shape_fields: layers, width, heads ...) the configuration's; vocabulary and context come
    from config.json."""
    path, values = _config_values(hf_dir)
    expected = get_family(preset_config.family).hf_model_type
    if values.get("model_type") != expected:
        raise HFError("%s: model_type %r is not the Hugging Face layout of model %s (model_type %r): init_from "
                      "must be a checkpoint of the family being trained" % (
                          path, values.get("model_type"), preset_config.family, expected))
    layout = family_layout(preset_config.family, "hf_import")
    config = layout.read_config(path, values)
    differ = ["%s %r (checkpoint) vs %r" % (name, getattr(config, name), getattr(preset_config, name))
              for name in layout.shape_fields if getattr(config, name) != getattr(preset_config, name)]
    if differ:
        raise HFError("%s: the checkpoint is not %s: %s" % (path, label, "; ".join(differ)))
    return config.replace(dropout=preset_config.dropout)


def check_same_tokenizer(hf_dir, tokenizer_file):
    """The dataset must be tokenized with the checkpoint's tokenizer (same ids)."""
    from tokenizers import Tokenizer

    theirs = hf_tokenizer_file(hf_dir)
    if Tokenizer.from_file(theirs).get_vocab() != Tokenizer.from_file(tokenizer_file).get_vocab():
        raise HFError("the dataset was tokenized with %s, whose vocabulary differs from the checkpoint's %s: "
                      "prepare the dataset with tokenizer=%s" % (tokenizer_file, theirs, theirs))


def load_weights(model, hf_dir):
    """Assign the checkpoint in `hf_dir` (model.safetensors or its shards) to `model` through its
    family's layout, one tensor at a time; returns it."""
    layout = family_layout(model.model_config.family, "hf_import")
    path, tensors = checkpoint_tensors(hf_dir)
    return assign(model, layout, tensors, path)
