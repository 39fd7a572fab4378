"""Hugging Face GPT-2 directories: write one from our export, or read one into our format.

The directory `transformers` loads as GPT2LMHeadModel / TFGPT2LMHeadModel:

    config.json             GPT2Config (activation gelu_new = our GELU tanh approximation)
    model.safetensors       the PyTorch GPT-2 tensor names and layout: Conv1D weights stored
                            [in, out], which is our kernels' layout, so no transpose
    generation_config.json  bos/eos = the end-of-document token
    tokenizer.json          our tokenizers file, unchanged (same ids)
    tokenizer_config.json   GPT2TokenizerFast with the end-of-document token as eos

Padded vocabulary rows are cut: the HF vocab_size is the model's real vocab_size (the logits of
real tokens are unchanged), and config.json keeps the padded size under "lmstack".
Imported checkpoints get pad_vocab_to=1, so the softmax runs over the same rows as in
transformers and the loss is the same.

safetensors is written and read here from its specification
(https://github.com/huggingface/safetensors, "Format": an 8-byte little-endian header size, a
JSON header of dtype/shape/data_offsets, then the raw little-endian C-order bytes), so the
training image needs neither `transformers` nor `safetensors`.
"""
import json
import os
import shutil
import struct

import numpy as np

from lm.serving import export as lm_export
from lm import models
from lm.spec.families import FAMILIES, GPTConfig, capability_message, families_with, get_family
from lm.data.tokenizer import EOD_TOKEN, eod_id

SAFETENSORS_FILE = "model.safetensors"
HF_CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
LAYER_NORM_EPSILON = 1e-5
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8")}


class HFError(ValueError):
    """A model or directory that cannot be converted; names the file or field."""


def write_safetensors(tensors, path, metadata=None):
    """tensors: name -> float32 array; written in name order."""
    header, offset = {}, 0
    arrays = []
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    if metadata:
        header["__metadata__"] = metadata
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the spec allows trailing spaces; aligns the data
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for array in arrays:
            f.write(array.tobytes())


def read_safetensors(path):
    """name -> float32 array (F16/F64 are converted)."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > os.fstat(f.fileno()).st_size - 8:
                raise ValueError("header length %d exceeds the file" % size)
            header = json.loads(f.read(size).decode("utf-8"))
            data = f.read()
    except (OSError, ValueError, struct.error) as error:
        raise HFError("%s: not a safetensors file: %s" % (path, error))
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in _DTYPES:
            raise HFError("%s: tensor %s has dtype %s; readable: %s" % (
                path, name, entry["dtype"], ", ".join(sorted(_DTYPES))))
        begin, end = entry["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])
        tensors[name] = array.astype(np.float32)
    return tensors


def _check_gpt2_shaped(config):
    if not get_family(config.family).supports("hf_export"):
        raise HFError(capability_message(config.family, "the Hugging Face export", "hf_export"))
    if config.family != "gpt":
        raise HFError("family %r has no GPT-2 layout; this converter writes family 'gpt' only" % config.family)
    problems = []
    if config.norm != "pre":
        problems.append("norm=%r (GPT-2 is 'pre')" % config.norm)
    if config.activation != "gelu":
        problems.append("activation=%r (GPT-2 is 'gelu')" % config.activation)
    if not config.tie_embeddings:
        problems.append("tie_embeddings=False (GPT-2 ties them)")
    if config.attention_head_dim * config.n_head != config.d_model:
        problems.append("head_dim=%r (GPT-2 is d_model // n_head)" % config.head_dim)
    if problems:
        raise HFError("this gpt config is not GPT-2: %s" % "; ".join(problems))


def gpt2_variables(model):
    """Our GPT's variables by their GPT-2 name (as in GPT2Model's state dict)."""
    variables = {"wte.weight": model.embedding.token_table, "wpe.weight": model.embedding.position_table,
                 "ln_f.weight": model.ln_f.gamma, "ln_f.bias": model.ln_f.beta}
    for i, block in enumerate(model.blocks):
        attention, mlp = block.attention, block.mlp
        for name, variable in [
                ("ln_1.weight", block.ln_1.gamma), ("ln_1.bias", block.ln_1.beta),
                ("ln_2.weight", block.ln_2.gamma), ("ln_2.bias", block.ln_2.beta),
                ("attn.c_attn.weight", attention.qkv_kernel), ("attn.c_attn.bias", attention.qkv_bias),
                ("attn.c_proj.weight", attention.output_kernel), ("attn.c_proj.bias", attention.output_bias),
                ("mlp.c_fc.weight", mlp.fc_kernel), ("mlp.c_fc.bias", mlp.fc_bias),
                ("mlp.c_proj.weight", mlp.proj_kernel), ("mlp.c_proj.bias", mlp.proj_bias)]:
            variables["h.%d.%s" % (i, name)] = variable
    return variables


def gpt2_tensors(model, config):
    """The PyTorch GPT2LMHeadModel state dict (without the tied lm_head) of our GPT model,
    padded vocabulary rows cut."""
    tensors = {"transformer." + name: variable.numpy() for name, variable in gpt2_variables(model).items()}
    tensors["transformer.wte.weight"] = tensors["transformer.wte.weight"][:config.vocab_size]
    return tensors


def gpt2_config(config, eos_id):
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_ctx": config.block_size,
        "n_embd": config.d_model,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": LAYER_NORM_EPSILON,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
        "lmstack": {"padded_vocab_size": config.padded_vocab_size,
                    "note": "the %d padded embedding rows lmstack trains with are cut; they are "
                            "never produced by the tokenizer" % (config.padded_vocab_size - config.vocab_size)},
    }


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


def export_hf(export_dir, output_dir):
    """Write the Hugging Face GPT-2 directory of an `lm.serving.export` directory; returns output_dir."""
    model, config, _ = lm_export.load_exported(export_dir)
    return write_hf(model, config, os.path.join(export_dir, lm_export.TOKENIZER_FILE), output_dir)


def write_hf(model, config, tokenizer_file, output_dir):
    """Write the Hugging Face GPT-2 files of a model; `output_dir` may be the `lm.serving.export`
    directory itself (lm.training.train's export_hf): no file name is shared but tokenizer.json, which
    is the same file."""
    from tokenizers import Tokenizer

    _check_gpt2_shaped(config)
    tokenizer = Tokenizer.from_file(tokenizer_file)
    eos = eod_id(tokenizer, EOD_TOKEN, tokenizer_file)
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise HFError("%s: tokenizer has %d tokens but the model's vocab_size is %d" % (
            tokenizer_file, tokenizer.get_vocab_size(), config.vocab_size))
    os.makedirs(output_dir, exist_ok=True)
    write_safetensors(gpt2_tensors(model, config), os.path.join(output_dir, SAFETENSORS_FILE), {"format": "pt"})
    _write_json(os.path.join(output_dir, HF_CONFIG_FILE), gpt2_config(config, eos))
    _write_json(os.path.join(output_dir, GENERATION_CONFIG_FILE),
                {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos})
    target = os.path.join(output_dir, lm_export.TOKENIZER_FILE)
    if not (os.path.exists(target) and os.path.samefile(tokenizer_file, target)):
        shutil.copyfile(tokenizer_file, target)
    _write_json(os.path.join(output_dir, TOKENIZER_CONFIG_FILE), {
        "tokenizer_class": "GPT2TokenizerFast", "model_max_length": config.block_size,
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
    path, values = _config_values(hf_dir)
    importing = [name for name in families_with("hf_import") if FAMILIES[name].hf_model_type == values.get("model_type")]
    if not importing:
        raise HFError("%s: model_type %r; the families that import a Hugging Face layout read model_type %s" % (
            path, values.get("model_type"), ", ".join("%r (model %s)" % (FAMILIES[name].hf_model_type, name)
                                                      for name in families_with("hf_import"))))
    return _gpt_config(path, values)


def _gpt_config(path, values):
    """The GPTConfig of config.json's `values` (read from `path`); HFError where lmstack's GPT differs."""
    if values.get("model_type") != "gpt2":
        raise HFError("%s: model_type %r; only 'gpt2' can be imported" % (path, values.get("model_type")))
    if values.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise HFError("%s: activation_function %r; lmstack's GELU is the tanh approximation "
                      "(gelu_new)" % (path, values.get("activation_function")))
    if values.get("n_inner") not in (None, 4 * values["n_embd"]):
        raise HFError("%s: n_inner %r; lmstack's MLP is 4 * n_embd" % (path, values.get("n_inner")))
    if not values.get("tie_word_embeddings", True):
        raise HFError("%s: tie_word_embeddings false; lmstack imports tied GPT-2 only" % path)
    for field in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if values.get(field):
            raise HFError("%s: %s true is not supported" % (path, field))
    if abs(values.get("layer_norm_epsilon", LAYER_NORM_EPSILON) - LAYER_NORM_EPSILON) > 1e-12:
        raise HFError("%s: layer_norm_epsilon %r; lmstack uses %g" % (
            path, values.get("layer_norm_epsilon"), LAYER_NORM_EPSILON))
    return GPTConfig(n_layer=values["n_layer"], d_model=values["n_embd"], n_head=values["n_head"],
                     block_size=values["n_positions"], vocab_size=values["vocab_size"], pad_vocab_to=1,
                     dropout=values.get("resid_pdrop", 0.0))


def _pytorch_name(name, value):
    """(GPT2Model state-dict name, value) of a tensor as GPT2LMHeadModel, GPT2Model or
    TFGPT2LMHeadModel.save_pretrained names it ("transformer/h_._0/ln_1/gamma:0": TF names,
    biases [1, n])."""
    if "/" in name:
        name = name.split(":")[0].replace("/", ".").replace("h_._", "h.")
        name = name.replace(".gamma", ".weight").replace(".beta", ".bias").replace(".embeddings", ".weight")
        if name.endswith(".bias") and value.ndim == 2 and value.shape[0] == 1:
            value = value[0]
    if name.startswith("transformer."):
        name = name[len("transformer."):]
    return name, value


def hf_tokenizer_file(hf_dir):
    tokenizer_file = os.path.join(hf_dir, lm_export.TOKENIZER_FILE)
    if not os.path.isfile(tokenizer_file):
        raise HFError("%s: not found; the import needs the fast tokenizer file" % tokenizer_file)
    return tokenizer_file


def dataset_tokenizer(hf_dir, eod_token=EOD_TOKEN):
    """(tokenizer.json, the end-of-document token) to tokenize a dataset with for the GPT-2 in `hf_dir`
    (lm.data.prepare --init-from): the token of config.json's eos_token_id (`eod_token` when it names none);
    the tokenizer must fit the vocab_size config.json gives the model."""
    from tokenizers import Tokenizer

    path, values = _config_values(hf_dir)
    config = _gpt_config(path, values)
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
    """Write an `lm.serving.export` directory from a Hugging Face GPT-2 directory (config.json,
    model.safetensors, tokenizer.json); returns export_dir."""
    config = _read_hf_config(hf_dir)
    tokenizer_file = hf_tokenizer_file(hf_dir)
    model = load_weights(models.build(config), hf_dir)
    return lm_export.export_model(model, config, tokenizer_file, export_dir)


def init_config(hf_dir, preset_config, label):
    """The config to train from the GPT-2 in `hf_dir` (lm.training.train's init_from): the preset's shape
    (layers, width, heads) must be the checkpoint's; vocabulary and context come from config.json.
    The checkpoint's model_type must be the Hugging Face layout the preset's family declares."""
    path, values = _config_values(hf_dir)
    expected = get_family(preset_config.family).hf_model_type
    if values.get("model_type") != expected:
        raise HFError("%s: model_type %r is not the Hugging Face layout of model %s (model_type %r): init_from "
                      "must be a checkpoint of the family being trained" % (
                          path, values.get("model_type"), preset_config.family, expected))
    config = _gpt_config(path, values)
    differ = ["%s %r (checkpoint) vs %r" % (name, getattr(config, name), getattr(preset_config, name))
              for name in ("n_layer", "d_model", "n_head") if getattr(config, name) != getattr(preset_config, name)]
    if differ:
        raise HFError("%s: the checkpoint is not %s: %s" % (os.path.join(hf_dir, HF_CONFIG_FILE), label,
                                                           "; ".join(differ)))
    return config.replace(dropout=preset_config.dropout)


def check_same_tokenizer(hf_dir, tokenizer_file):
    """The dataset must be tokenized with the checkpoint's tokenizer (same ids)."""
    from tokenizers import Tokenizer

    theirs = hf_tokenizer_file(hf_dir)
    if Tokenizer.from_file(theirs).get_vocab() != Tokenizer.from_file(tokenizer_file).get_vocab():
        raise HFError("the dataset was tokenized with %s, whose vocabulary differs from the checkpoint's %s: "
                      "prepare the dataset with tokenizer=%s" % (tokenizer_file, theirs, theirs))


def load_weights(model, hf_dir):
    """Assign the GPT-2 tensors of `hf_dir`/model.safetensors to our GPT `model`; returns it."""
    tensors = read_safetensors(os.path.join(hf_dir, SAFETENSORS_FILE))
    tensors = dict(_pytorch_name(name, value) for name, value in tensors.items())
    tensors = {name: value for name, value in tensors.items()
               if not name.endswith(".attn.bias") and name != "lm_head.weight"}  # causal mask, tied head
    variables = gpt2_variables(model)
    missing = sorted(set(variables) - set(tensors))
    unexpected = sorted(set(tensors) - set(variables))
    if missing or unexpected:
        raise HFError("%s: missing tensors %s, unexpected tensors %s" % (
            os.path.join(hf_dir, SAFETENSORS_FILE), missing[:5], unexpected[:5]))
    for name, variable in variables.items():
        if tensors[name].shape != tuple(variable.shape):
            raise HFError("%s: tensor %s has shape %s, config.json implies %s" % (
                SAFETENSORS_FILE, name, tensors[name].shape, tuple(variable.shape)))
        variable.assign(tensors[name])
    return model
