"""What every family's Hugging Face layout shares (`lm.hf` drives the conversion, `lm.hf.gpt2` and
`lm.hf.llama` plug into it): the error type, safetensors I/O, and the `Layout` a family's
conversion declares.

safetensors is written and read here from its specification
(https://github.com/huggingface/safetensors, "Format": an 8-byte little-endian header size, a
JSON header of dtype/shape/data_offsets, then the raw little-endian C-order bytes), so the
training image needs neither `transformers` nor `safetensors`.
"""
import collections
import json
import os
import struct

import numpy as np

SAFETENSORS_FILE = "model.safetensors"
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8")}


class Layout(collections.namedtuple("Layout", [
        "model_type", "tokenizer_class", "shape_fields", "check", "hf_config", "read_config", "export_tensors",
        "import_tensors", "variables"])):
    """One Hugging Face layout, for the families whose declaration names its `model_type`
    (`lm.spec.families.ModelFamily.hf_model_type`). tokenizer_class: tokenizer_config.json's;
    shape_fields: the config fields a checkpoint must share with the configuration it initializes
    (init_from). Functions:
    check(config): raise HFError where the config is not this layout;
    hf_config(config, eos_id) -> config.json's values; read_config(path, values) -> our config;
    export_tensors(model, config) -> {HF name: array}, padded vocabulary rows cut;
    import_tensors({HF name: array}) -> {HF name: array shaped as our variable}, unused tensors left out;
    variables(model) -> {HF name: our variable}."""


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


def shared_hf_config(config, eos_id):
    """The config.json values of every layout: the end-of-document token as bos and eos, float32
    weights, and the padded vocabulary lmstack trained with."""
    return {
        "use_cache": True,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
        "lmstack": {"padded_vocab_size": config.padded_vocab_size,
                    "note": "the %d padded embedding rows lmstack trains with are cut; they are "
                            "never produced by the tokenizer" % (config.padded_vocab_size - config.vocab_size)},
    }


def assign(model, layout, tensors, path):
    """Assign `tensors` (as read from `path`) to `model`'s variables through `layout`; returns the model."""
    tensors = layout.import_tensors(tensors)
    variables = layout.variables(model)
    missing = sorted(set(variables) - set(tensors))
    unexpected = sorted(set(tensors) - set(variables))
    if missing or unexpected:
        raise HFError("%s: missing tensors %s, unexpected tensors %s" % (path, missing[:5], unexpected[:5]))
    for name, variable in variables.items():
        if tensors[name].shape != tuple(variable.shape):
            raise HFError("%s: tensor %s has shape %s, config.json implies %s" % (
                os.path.basename(path), name, tensors[name].shape, tuple(variable.shape)))
        variable.assign(tensors[name])
    return model
