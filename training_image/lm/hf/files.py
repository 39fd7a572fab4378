"""What every family's Hugging Face layout shares (`lm.hf` drives the conversion, `lm.hf.gpt2` and
`lm.hf.llama` plug into it): the error type, safetensors I/O of single and sharded checkpoints, and
the `Layout` a family's conversion declares.

safetensors is written and read here from its specification
(https://github.com/huggingface/safetensors, "Format": an 8-byte little-endian header size, a
JSON header of dtype/shape/data_offsets, then the raw little-endian C-order bytes), so the
training image needs neither `transformers` nor `safetensors`. Tensors are read one at a time
from their byte range and written one at a time, so neither an import nor an export holds a
second copy of the model.

A checkpoint is `model.safetensors`, or shards `model-0000k-of-0000n.safetensors` with
`model.safetensors.index.json` ({"metadata": {"total_size": bytes}, "weight_map": {tensor: shard}}),
as transformers' `save_pretrained` writes them (huggingface_hub's split_state_dict_into_shards:
tensors in order, a new shard where the next tensor would pass `max_shard_size`, a tensor larger
than that in a shard of its own; sizes in decimal units, "5GB" = 5 x 10^9 bytes, the default).
"""
import collections
import json
import os
import re
import struct

import numpy as np

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
SHARD_FILE = "model-%05d-of-%05d.safetensors"
_SHARD_PATTERN = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
DEFAULT_MAX_SHARD_SIZE = "5GB"  # transformers' save_pretrained default
SIZE_UNITS = {"TB": 10 ** 12, "GB": 10 ** 9, "MB": 10 ** 6, "KB": 10 ** 3}
# The dtypes a checkpoint is written in, by their config.json `torch_dtype` name -> safetensors' code.
EXPORT_DTYPES = collections.OrderedDict([("float32", "F32"), ("bfloat16", "BF16"), ("float16", "F16")])
# safetensors code -> the little-endian dtype its bytes are read as (BF16 as raw 16-bit words: numpy
# has no bfloat16, and a bfloat16 is the upper half of the float32 with the same sign, exponent and
# leading mantissa bits).
_READ_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2")}


class Layout(collections.namedtuple("Layout", [
        "model_type", "tokenizer_class", "export_dtype", "shape_fields", "check", "hf_config", "read_config",
        "export_tensors", "import_name", "import_value", "variables"])):
    """One Hugging Face layout, for the families whose declaration names its `model_type`
    (`lm.spec.families.ModelFamily.hf_model_type`). tokenizer_class: tokenizer_config.json's;
    export_dtype: the dtype an export is written in unless asked otherwise (as the family's models
    are published); shape_fields: the config fields a checkpoint must share with the configuration
    it initializes (init_from). Functions:
    check(config): raise HFError where the config is not this layout;
    hf_config(config, eos_id, dtype) -> config.json's values; read_config(path, values) -> our config;
    export_tensors(model, config) -> {HF name: Tensor}, padded vocabulary rows cut;
    import_name(name, config) -> the HF name of our variable the checkpoint's tensor `name` sets, or
    None for a tensor the model does not use; import_value(name, array) -> the array shaped as our
    variable `name`; variables(model) -> {HF name: our variable}."""


class HFError(ValueError):
    """A model or directory that cannot be converted; names the file or field."""


class Tensor(collections.namedtuple("Tensor", "shape produce")):
    """A tensor to write: its shape and a function returning it as a float32 array, called only when
    the tensor is written."""


def as_tensor(array):
    array = np.asarray(array, dtype=np.float32)
    return Tensor(array.shape, lambda: array)


def parse_size(size):
    """Bytes of a shard size: an int, or digits and a unit of SIZE_UNITS ("5GB", "500MB"), as
    huggingface_hub's parse_size_to_int reads it."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        text = str(size).strip()
        try:
            value = int(float(text[:-2].strip()) * SIZE_UNITS[text[-2:].upper()])
        except (KeyError, ValueError):
            raise HFError("max_shard_size %r: a number of bytes or digits with a unit of %s (e.g. 5GB)" % (
                size, ", ".join(SIZE_UNITS)))
    if value < 1:
        raise HFError("max_shard_size %r must be at least 1 byte" % (size,))
    return value


def check_dtype(dtype):
    if dtype not in EXPORT_DTYPES:
        raise HFError("dtype %r; allowed: %s" % (dtype, ", ".join(EXPORT_DTYPES)))
    return dtype


def bfloat16_bits(array):
    """The bfloat16 words of a float32 array, rounded to nearest even (as PyTorch's conversion):
    the upper 16 bits after adding 0x7FFF plus the lowest kept bit; NaN stays a quiet NaN."""
    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4")
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype("<u2")
    nan = np.isnan(array)
    if nan.any():  # the addition can carry a NaN's mantissa into the sign
        rounded[nan] = (bits[nan] >> np.uint32(16)).astype("<u2") | np.uint16(0x0040)
    return rounded


def _encoded(array, code):
    """The bytes of a float32 array as safetensors' `code`, as a buffer (no copy where none is needed)."""
    array = np.asarray(array, dtype=np.float32)
    if code == "BF16":
        return bfloat16_bits(array).data
    return np.ascontiguousarray(array, dtype=_READ_DTYPES[code]).data


def _nbytes(shape, code):
    return int(np.prod(shape, dtype=np.int64)) * _READ_DTYPES[code].itemsize


def write_safetensors(tensors, path, metadata=None, dtype="float32"):
    """tensors: name -> float32 array or Tensor, written in name order as `dtype` (EXPORT_DTYPES),
    one at a time, to `path` (through a temporary file: a failed write leaves no partial file)."""
    code = EXPORT_DTYPES[check_dtype(dtype)]
    tensors = {name: value if isinstance(value, Tensor) else as_tensor(value) for name, value in tensors.items()}
    header, offset = {}, 0
    for name in sorted(tensors):
        size = _nbytes(tensors[name].shape, code)
        header[name] = {"dtype": code, "shape": [int(n) for n in tensors[name].shape],
                        "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = metadata
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the spec allows trailing spaces; aligns the data
    temporary = path + ".tmp"
    try:
        with open(temporary, "wb") as f:
            f.write(struct.pack("<Q", len(encoded)))
            f.write(encoded)
            for name in sorted(tensors):
                array = tensors[name].produce()
                if tuple(array.shape) != tuple(tensors[name].shape):
                    raise HFError("tensor %s has shape %s, declared %s" % (name, array.shape, tensors[name].shape))
                f.write(_encoded(array, code))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return offset


def shard(tensors, dtype, max_shard_size):
    """[[name ...] per shard] for `tensors` (name -> Tensor, in their order), as huggingface_hub splits a
    state dict: a new shard where the next tensor would pass max_shard_size, and a tensor larger
    than it in a shard of its own."""
    code, limit = EXPORT_DTYPES[check_dtype(dtype)], parse_size(max_shard_size)
    shards, current, current_size = [], [], 0
    for name, tensor in tensors.items():
        size = _nbytes(tensor.shape, code)
        if size > limit:
            shards.append([name])
            continue
        if current and current_size + size > limit:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    if current or not shards:
        shards.append(current)
    return shards


def write_checkpoint(tensors, output_dir, dtype="float32", max_shard_size=DEFAULT_MAX_SHARD_SIZE):
    """Write `tensors` (name -> Tensor or array, in state-dict order) to `output_dir` as transformers'
    save_pretrained does: one model.safetensors when they fit in max_shard_size, else shards and
    model.safetensors.index.json. Checkpoint files of an earlier export there that this one does not
    replace are removed afterwards, so no stale shard or index is left for a loader to find.
    Returns the files written."""
    tensors = collections.OrderedDict(
        (name, value if isinstance(value, Tensor) else as_tensor(value)) for name, value in tensors.items())
    groups = shard(tensors, dtype, max_shard_size)
    if len(groups) == 1:
        write_safetensors(tensors, os.path.join(output_dir, SAFETENSORS_FILE), {"format": "pt"}, dtype)
        written = [SAFETENSORS_FILE]
    else:
        written, weight_map, total = [], {}, 0
        for number, names in enumerate(groups, start=1):
            filename = SHARD_FILE % (number, len(groups))
            total += write_safetensors(collections.OrderedDict((name, tensors[name]) for name in names),
                                       os.path.join(output_dir, filename), {"format": "pt"}, dtype)
            weight_map.update((name, filename) for name in names)
            written.append(filename)
        index = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True)
        with open(os.path.join(output_dir, SAFETENSORS_INDEX_FILE), "w") as f:
            f.write(index + "\n")
        written.append(SAFETENSORS_INDEX_FILE)
    for name in os.listdir(output_dir):
        stale = name in (SAFETENSORS_FILE, SAFETENSORS_INDEX_FILE) or _SHARD_PATTERN.fullmatch(name)
        if stale and name not in written:
            os.remove(os.path.join(output_dir, name))
    return written


class SafetensorsFile:
    """The header of a safetensors file; `read(name)` reads one tensor's bytes, as float32."""

    def __init__(self, path):
        self.path = path
        try:
            with open(path, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                file_size = os.fstat(f.fileno()).st_size
                if size > file_size - 8:
                    raise ValueError("header length %d exceeds the file" % size)
                header = json.loads(f.read(size).decode("utf-8"))
        except (OSError, ValueError, struct.error) as error:
            raise HFError("%s: not a safetensors file: %s" % (path, error))
        self.data_start = 8 + size
        self.entries = collections.OrderedDict(
            (name, entry) for name, entry in header.items() if name != "__metadata__")
        for name, entry in self.entries.items():
            if entry.get("dtype") not in _READ_DTYPES:
                raise HFError("%s: tensor %s has dtype %s; readable: %s" % (
                    path, name, entry.get("dtype"), ", ".join(sorted(_READ_DTYPES))))
            begin, end = entry["data_offsets"]
            if end - begin != _nbytes(entry["shape"], entry["dtype"]) or self.data_start + end > file_size:
                raise HFError("%s: tensor %s: data_offsets %s do not hold a %s %s in the file" % (
                    path, name, entry["data_offsets"], entry["dtype"], entry["shape"]))

    def names(self):
        return list(self.entries)

    def read(self, name):
        entry = self.entries[name]
        begin, end = entry["data_offsets"]
        raw = np.empty(entry["shape"], dtype=_READ_DTYPES[entry["dtype"]])
        with open(self.path, "rb") as f:
            f.seek(self.data_start + begin)
            if f.readinto(memoryview(raw).cast("B")) != end - begin:
                raise HFError("%s: tensor %s is cut short" % (self.path, name))
        if entry["dtype"] == "BF16":
            widened = raw.astype("<u4")
            widened <<= np.uint32(16)
            return widened.view("<f4")
        return raw.astype(np.float32, copy=False)


def read_safetensors(path):
    """name -> float32 array of every tensor of one file (F16, BF16 and F64 are converted)."""
    source = SafetensorsFile(path)
    return collections.OrderedDict((name, source.read(name)) for name in source.names())


def checkpoint_tensors(hf_dir):
    """(what it is read from, {tensor name: the SafetensorsFile holding it}) of the checkpoint in
    `hf_dir`: model.safetensors, else the shards model.safetensors.index.json maps (the file
    transformers prefers when both exist)."""
    single, index = os.path.join(hf_dir, SAFETENSORS_FILE), os.path.join(hf_dir, SAFETENSORS_INDEX_FILE)
    if os.path.isfile(single):
        source = SafetensorsFile(single)
        return single, collections.OrderedDict((name, source) for name in source.names())
    if not os.path.isfile(index):
        raise HFError("%s: neither %s nor %s (PyTorch .bin checkpoints are not read: save with "
                      "safe_serialization, the default)" % (hf_dir, SAFETENSORS_FILE, SAFETENSORS_INDEX_FILE))
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        if not isinstance(weight_map, dict):
            raise ValueError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise HFError("%s: cannot read its weight_map: %s" % (index, error))
    shards, found = {}, collections.OrderedDict()
    for name, filename in weight_map.items():
        if not isinstance(filename, str) or os.path.basename(filename) != filename:
            raise HFError("%s: weight_map names %r for %s; a shard is a file name in %s" % (index, filename, name, hf_dir))
        if filename not in shards:
            if not os.path.isfile(os.path.join(hf_dir, filename)):
                raise HFError("%s: shard %s (of %s) not found" % (index, filename, name))
            shards[filename] = SafetensorsFile(os.path.join(hf_dir, filename))
        if name not in shards[filename].entries:
            raise HFError("%s: %s has no tensor %s, which the weight_map puts there" % (index, filename, name))
        found[name] = shards[filename]
    return index, found


def shared_hf_config(config, eos_id, dtype):
    """The config.json values of every layout: the end-of-document token as bos and eos, the dtype
    of the weights, and the padded vocabulary lmstack trained with."""
    return {
        "use_cache": True,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": dtype,
        "lmstack": {"padded_vocab_size": config.padded_vocab_size,
                    "note": "the %d padded embedding rows lmstack trains with are cut; they are "
                            "never produced by the tokenizer" % (config.padded_vocab_size - config.vocab_size)},
    }


def assign(model, layout, tensors, path):
    """Assign the checkpoint's `tensors` ({name: SafetensorsFile}, read from `path`) to `model`'s
    variables through `layout`, one tensor read at a time; returns the model."""
    sources = {}
    for theirs, source in tensors.items():
        ours = layout.import_name(theirs, model.model_config)
        if ours is not None:
            sources[ours] = (theirs, source)
    variables = layout.variables(model)
    missing = sorted(set(variables) - set(sources))
    unexpected = sorted(set(sources) - set(variables))
    if missing or unexpected:
        raise HFError("%s: missing tensors %s, unexpected tensors %s" % (path, missing[:5], unexpected[:5]))
    for name, variable in variables.items():
        theirs, source = sources[name]
        value = layout.import_value(name, source.read(theirs))
        if value.shape != tuple(variable.shape):
            raise HFError("%s: tensor %s has shape %s, config.json implies %s" % (
                os.path.basename(source.path), theirs, value.shape, tuple(variable.shape)))
        variable.assign(value)
    return model
