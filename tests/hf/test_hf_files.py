"""lm.hf.files: safetensors in float32, float16 and bfloat16, single files and shards with their index as
transformers writes them, one tensor in memory at a time, and the refusals of a broken checkpoint.
That transformers and safetensors read what these write (and the other way round) is
tests/hf/test_hf_llama.py's part."""
import json
import os
import tracemalloc

import numpy as np
import pytest

from lm import hf, models
from lm.tokenizer import save, train_bpe
from lm.hf import files
from lm.spec.families import LlamaConfig


def header_of(path):
    with open(path, "rb") as f:
        return json.loads(f.read(int.from_bytes(f.read(8), "little")))


def test_bfloat16_rounds_to_nearest_even():
    # 1 + 2^-8 lies halfway between bfloat16's 1 and 1 + 2^-7: to the even one, 1 (0x3F80);
    # 1 + 3 x 2^-8 between 1 + 2^-7 and 1 + 2^-6: to the even 1 + 2^-6 (0x3F82); past the largest
    # bfloat16 rounds to infinity; NaN stays NaN.
    values = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.4028235e38, -np.inf, 0.0, -0.0, np.nan],
                      np.float32)
    bits = files.bfloat16_bits(values)
    assert [hex(b) for b in bits[:7]] == ["0x3f80", "0x3f82", "0xbf80", "0x7f80", "0xff80", "0x0", "0x8000"]
    assert bits[7] & 0x7F80 == 0x7F80 and bits[7] & 0x7F


def test_a_tensor_round_trips_in_every_export_dtype(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"w": rng.normal(0, 3, [7, 5]).astype(np.float32), "b": np.array([1 + 2 ** -8, -2.5, 0.1], np.float32)}
    for dtype, code, tolerance in [("float32", "F32", 0), ("float16", "F16", 2 ** -11), ("bfloat16", "BF16", 2 ** -8)]:
        path = str(tmp_path / (dtype + ".safetensors"))
        files.write_safetensors(tensors, path, {"format": "pt"}, dtype)
        header = header_of(path)
        itemsize = 4 if dtype == "float32" else 2
        assert header["b"] == {"dtype": code, "shape": [3], "data_offsets": [0, 3 * itemsize]}  # name order
        back = hf.read_safetensors(path)
        for name, value in tensors.items():
            assert back[name].dtype == np.float32
            np.testing.assert_allclose(back[name], value, rtol=tolerance, atol=0)
        if dtype == "bfloat16":
            assert back["b"][0] == 1.0 and back["b"][1] == -2.5  # the tie went to even; -2.5 is exact
    with pytest.raises(hf.HFError, match="dtype 'int8'; allowed: float32, bfloat16, float16"):
        files.write_safetensors(tensors, str(tmp_path / "x.safetensors"), dtype="int8")


def test_shards_split_as_huggingface_hub_splits_a_state_dict():
    """huggingface_hub 0.26 serialization/_base.py:100-142: in order, a new shard where the next tensor
    would pass the limit, a tensor above the limit in a shard of its own."""
    tensors = {name: files.Tensor((size // 4,), None) for name, size in
               [("a", 800), ("b", 800), ("c", 2400), ("d", 400), ("e", 400), ("f", 1200)]}
    # c, above the limit, is closed into a shard of its own at once, before the a, b, d it passed
    assert files.shard(tensors, "float32", "2KB") == [["c"], ["a", "b", "d"], ["e", "f"]]
    assert files.shard(tensors, "float32", 10 ** 6) == [list(tensors)]
    assert files.shard(tensors, "bfloat16", "2KB") == [["a", "b", "c"], ["d", "e", "f"]]
    assert files.parse_size("5GB") == 5 * 10 ** 9 and files.parse_size("1.5 MB") == 1500000 and files.parse_size(7) == 7
    for bad in ("5 GiB", "lots", 0, "-1KB"):
        with pytest.raises(hf.HFError, match="max_shard_size"):
            files.parse_size(bad)


def test_a_sharded_checkpoint_has_transformers_names_and_index_and_replaces_an_earlier_one(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {"layer.%d" % i: rng.normal(size=[16, 16]).astype(np.float32) for i in range(5)}
    out = str(tmp_path)
    files.write_checkpoint(tensors, out, "float32", 16 * 16 * 4)  # whole model in one file first
    written = files.write_checkpoint(tensors, out, "bfloat16", 2 * 16 * 16 * 2)
    assert written == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                       "model-00003-of-00003.safetensors", "model.safetensors.index.json"]
    assert sorted(os.listdir(out)) == sorted(written)  # the earlier model.safetensors is gone
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        index = json.load(f)
    assert index["metadata"] == {"total_size": 5 * 16 * 16 * 2}
    assert index["weight_map"] == {"layer.0": written[0], "layer.1": written[0], "layer.2": written[1],
                                   "layer.3": written[1], "layer.4": written[2]}
    source, found = files.checkpoint_tensors(out)
    assert source.endswith("model.safetensors.index.json") and sorted(found) == sorted(tensors)
    np.testing.assert_allclose(found["layer.3"].read("layer.3"), tensors["layer.3"], rtol=2 ** -8)
    assert files.write_checkpoint(tensors, out, "float32") == ["model.safetensors"]
    assert sorted(os.listdir(out)) == ["model.safetensors"]  # and the shards of the second


def _broken(tmp_path, change):
    out = str(tmp_path / "ckpt")
    os.makedirs(out)
    files.write_checkpoint({"a": np.ones([4, 4], np.float32), "b": np.zeros([4], np.float32)}, out, "float32", 64)
    change(out)
    return out


def _edit_index(update):
    def change(out):
        path = os.path.join(out, "model.safetensors.index.json")
        with open(path) as f:
            index = json.load(f)
        update(index)
        with open(path, "w") as f:
            json.dump(index, f)
    return change


@pytest.mark.parametrize("change, message", [
    (lambda out: os.remove(os.path.join(out, "model-00002-of-00002.safetensors")),
     r"index.json: shard model-00002-of-00002.safetensors \(of b\) not found"),
    (_edit_index(lambda index: index["weight_map"].update(c="model-00001-of-00002.safetensors")),
     "model-00001-of-00002.safetensors has no tensor c, which the weight_map puts there"),
    (_edit_index(lambda index: index["weight_map"].update(a="../elsewhere.safetensors")),
     "weight_map names '../elsewhere.safetensors' for a; a shard is a file name in"),
    (_edit_index(lambda index: index.pop("weight_map")), "cannot read its weight_map"),
    (lambda out: os.remove(os.path.join(out, "model.safetensors.index.json")),
     r"neither model.safetensors nor model.safetensors.index.json \(PyTorch .bin checkpoints are not read"),
    (lambda out: open(os.path.join(out, "model-00001-of-00002.safetensors"), "r+b").truncate(100),
     "model-00001-of-00002.safetensors: tensor a: data_offsets .* do not hold a F32 \\[4, 4\\] in the file"),
])
def test_a_broken_checkpoint_is_refused_naming_the_file_and_the_tensor(tmp_path, change, message):
    with pytest.raises(hf.HFError, match=message):
        files.checkpoint_tensors(_broken(tmp_path, change))


def test_a_dtype_lmstack_does_not_read_is_refused_naming_the_tensor(tmp_path):
    path = str(tmp_path / "model.safetensors")
    header = json.dumps({"q": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}).encode()
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + b"\x01\x02")
    with pytest.raises(hf.HFError, match="tensor q has dtype I8; readable: BF16, F16, F32, F64"):
        hf.read_safetensors(path)


def transient_memory(action):
    """numpy's allocations (what tracemalloc sees) at their peak while `action()` runs, above what is
    still allocated when it returns: the memory it held only while it ran.

    What stays is not judged: it can be the imported model's own storage. TensorFlow copies the array a
    variable is assigned (tensorflow/python/framework/constant_op.py, convert_to_eager_tensor, 2.15 line 91:
    `value.copy()`) and on CPU the variable may keep that copy as its buffer or copy it into TensorFlow's
    allocator, which depends on the machine (the buffer's alignment, the allocator's state); counting it
    made the measure fail on some machines. A conversion's second copy of the model is transient."""
    tracemalloc.start()
    try:
        action()
        staying, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - staying


def holds_one_tensor_at_a_time(transient, model_bytes):
    """A conversion that gathered every tensor first holds all of them at once (model_bytes); one
    tensor at a time holds the largest tensor and its converted copies."""
    return transient < model_bytes / 4


class InMemoryCheckpoint:
    """Every tensor of a checkpoint, read at once: what lm.hf must not do (the bad loader below)."""

    def __init__(self, hf_dir):
        self.path, tensors = files.checkpoint_tensors(hf_dir)
        self.values = {name: source.read(name) for name, source in tensors.items()}

    def read(self, name):
        return self.values[name]


def load_reading_every_tensor_first(model, hf_dir):
    checkpoint = InMemoryCheckpoint(hf_dir)
    layout = hf.family_layout(model.model_config.family, "hf_import")
    return files.assign(model, layout, {name: checkpoint for name in checkpoint.values}, checkpoint.path)


@pytest.fixture(scope="module")
def llama_and_tokenizer(tmp_path_factory):
    config = LlamaConfig(n_layer=8, d_model=256, n_head=4, n_kv_head=2, d_ff=704, block_size=64, vocab_size=512)
    tokenizer_file = str(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")
    save(train_bpe(["hello world %d" % i for i in range(50)], vocab_size=300), tokenizer_file)
    return config, models.build(config), tokenizer_file


def test_export_and_import_hold_one_tensor_at_a_time_not_a_second_copy_of_the_model(tmp_path, llama_and_tokenizer):
    config, model, tokenizer_file = llama_and_tokenizer
    model_bytes = 4 * model.count_params()
    other = models.build(config)
    for dtype in ("float32", "bfloat16"):
        out = str(tmp_path / dtype)
        exported = transient_memory(
            lambda: hf.write_hf(model, config, tokenizer_file, out, dtype=dtype, max_shard_size="3MB"))
        imported = transient_memory(lambda: hf.load_weights(other, out))
        assert len([name for name in os.listdir(out) if name.startswith("model-")]) > 4
        assert holds_one_tensor_at_a_time(exported, model_bytes), (dtype, exported, model_bytes)
        assert holds_one_tensor_at_a_time(imported, model_bytes), (dtype, imported, model_bytes)
        for theirs, ours in zip(other.weights, model.weights):
            np.testing.assert_allclose(theirs.numpy(), ours.numpy(), rtol=0 if dtype == "float32" else 2 ** -8)


def test_the_memory_measure_fails_for_a_loader_that_reads_every_tensor_first(tmp_path, llama_and_tokenizer):
    config, model, tokenizer_file = llama_and_tokenizer
    out = str(tmp_path / "float32")
    hf.write_hf(model, config, tokenizer_file, out, dtype="float32", max_shard_size="3MB")
    other = models.build(config)
    imported = transient_memory(lambda: load_reading_every_tensor_first(other, out))
    assert not holds_one_tensor_at_a_time(imported, 4 * model.count_params()), imported
    for theirs, ours in zip(other.weights, model.weights):  # it loads the model all the same
        np.testing.assert_array_equal(theirs.numpy(), ours.numpy())
