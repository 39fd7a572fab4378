"""`lm.hf --format hf` and `--from-hf` against transformers' own TFGPT2LMHeadModel, run in
.venv-hf (transformers 4.46.3 needs tokenizers 0.20; the project's environment has 0.23).
No fake here: the other side is the real library."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lm.serving import export as lm_export
from lm import hf, models
from lm.compat import keras, tf
from controlplane.presets import get_preset
from lm.serving.generate import generate_tokens
from lm.tokenizer import EOD_TOKEN, save, train_bpe
from family_cases import having_message

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_PYTHON = os.path.join(ROOT, ".venv-hf", "bin", "python")
HF_SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_side.py")
TEXT = "The quick brown fox jumps over the lazy dog. A small corpus 7"

# Skipped only on a machine without .venv-hf; in CI (CI set) a missing .venv-hf fails the tests.
requires_hf_venv = pytest.mark.skipif(
    not os.access(HF_PYTHON, os.X_OK) and not os.environ.get("CI"),
    reason=".venv-hf is missing: build it with `make .venv-hf/.installed` (`make test` does)")


def run_hf_side(*args):
    """tests/hf/hf_side.py in .venv-hf; returns its JSON line."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    result = subprocess.run([HF_PYTHON, HF_SIDE] + list(args), capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny GPT (vocab 500 padded to 512) with every weight randomized, exported."""
    root = tmp_path_factory.mktemp("hf")
    tokenizer_file = str(root / "tokenizer.json")
    save(train_bpe(["%s %d" % (TEXT, i) for i in range(50)] + ["jumps over lazy dogs"], vocab_size=300),
         tokenizer_file)
    keras.utils.set_random_seed(3)
    config = get_preset("tiny").replace(vocab_size=500)
    model = models.build(config)
    rng = np.random.default_rng(0)
    for weight in model.weights:  # LayerNorm and biases too, so a wrong mapping shows
        base = 1.0 if "gamma" in weight.name else 0.0
        weight.assign(base + rng.normal(0, 0.3, weight.shape).astype(np.float32))
    export_dir = str(root / "export")
    lm_export.export_model(model, config, tokenizer_file, export_dir)
    return model, config, export_dir, root


def test_cli_help_and_bad_arguments(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "lm.hf"] + list(args), capture_output=True, text=True,
                              cwd=os.path.join(ROOT, "training_image"))
    assert cli("--help").returncode == 0 and "--from-hf" in cli("--help").stdout
    bad_format = cli("--format", "onnx", str(tmp_path), str(tmp_path / "o"))
    assert bad_format.returncode == 2 and "--format" in bad_format.stderr and "'hf'" in bad_format.stderr
    missing = cli("--format", "hf", str(tmp_path / "nope"), str(tmp_path / "o"))
    assert missing.returncode == 2 and "source" in missing.stderr
    assert cli(str(tmp_path), str(tmp_path / "o")).returncode == 2
    empty = cli("--format", "hf", str(tmp_path), str(tmp_path / "o"))
    assert empty.returncode == 1 and "model.json" in empty.stderr


def test_export_writes_the_gpt2_layout_and_cuts_padded_rows(exported, tmp_path):
    model, config, export_dir, _ = exported
    out = str(tmp_path / "hf")
    hf.export_hf(export_dir, out)
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors",
                                       "tokenizer.json", "tokenizer_config.json"]
    tensors = hf.read_safetensors(os.path.join(out, "model.safetensors"))
    assert tensors["transformer.wte.weight"].shape == (500, 64)
    np.testing.assert_array_equal(tensors["transformer.wte.weight"], model.embedding.token_table.numpy()[:500])
    assert tensors["transformer.h.1.attn.c_attn.weight"].shape == (64, 192)  # Conv1D: [in, out]
    assert len(tensors) == 2 + 2 + 12 * config.n_layer
    with open(os.path.join(out, "config.json")) as f:
        values = json.load(f)
    assert values["vocab_size"] == 500 and values["lmstack"]["padded_vocab_size"] == 512
    with open(os.path.join(out, "tokenizer_config.json")) as f:
        assert json.load(f)["eos_token"] == EOD_TOKEN


@pytest.mark.parametrize("changes, message", [
    ({"norm": "post"}, "norm='post'"), ({"activation": "relu"}, "activation='relu'"),
    ({"tie_embeddings": False}, "tie_embeddings=False"), ({"head_dim": 32}, "head_dim=32"),
])
def test_export_refuses_configs_that_are_not_gpt2(tmp_path, exported, changes, message):
    _, _, export_dir, root = exported
    config = get_preset("tiny").replace(**changes)
    other = str(tmp_path / "export")
    lm_export.export_model(models.build(config), config, os.path.join(export_dir, "tokenizer.json"), other)
    with pytest.raises(hf.HFError, match=message):
        hf.export_hf(other, str(tmp_path / "hf"))


def test_export_refuses_the_rnn_family(tmp_path, exported):
    """python -m lm.hf --format hf reads the family's declaration: rnn has no hf_export."""
    config = get_preset("rnn-tiny")
    other = str(tmp_path / "export")
    lm_export.export_model(models.build(config), config, os.path.join(exported[2], "tokenizer.json"), other)
    with pytest.raises(hf.HFError, match=r"model rnn cannot use the Hugging Face export \(capability hf_export: .*\); "
                                         + having_message("hf_export")):
        hf.export_hf(other, str(tmp_path / "hf"))


def test_safetensors_round_trip_and_bad_file(tmp_path):
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones([5], np.float32)}
    path = str(tmp_path / "t.safetensors")
    hf.write_safetensors(tensors, path, {"format": "pt"})
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        assert size % 8 == 0 and json.loads(f.read(size))["a"] == {
            "dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    back = hf.read_safetensors(path)
    assert sorted(back) == ["a", "b"] and (back["a"] == tensors["a"]).all()
    with open(path, "wb") as f:
        f.write(b"nonsense")
    with pytest.raises(hf.HFError, match="not a safetensors file"):
        hf.read_safetensors(path)


@requires_hf_venv
def test_transformers_loads_the_export_with_the_same_logits_and_greedy_tokens(exported, tmp_path):
    model, config, export_dir, root = exported
    out = str(tmp_path / "hf")
    subprocess.run([sys.executable, "-m", "lm.hf", "--format", "hf", export_dir, out], check=True,
                   cwd=os.path.join(ROOT, "training_image"))
    rng = np.random.default_rng(1)
    batch = rng.integers(0, config.vocab_size, [4, 24]).astype(np.int32)
    prompts = rng.integers(0, 300, [2, 5]).astype(np.int32)
    inputs = str(tmp_path / "inputs.npz")
    np.savez(inputs, batch=batch, prompts=prompts, text=np.array(TEXT))
    report = run_hf_side("export", out, inputs)
    assert report["class"] == "TFGPT2LMHeadModel" and report["tokenizer_class"] == "GPT2TokenizerFast"
    assert report["missing_keys"] == [] and report["unexpected_keys"] == [] and report["mismatched_keys"] == []
    _, _, tokenizer = lm_export.load_exported(export_dir)
    assert report["eos_token"] == EOD_TOKEN and report["eos_token_id"] == tokenizer.token_to_id(EOD_TOKEN)
    assert report["ids"] == tokenizer.encode(TEXT).ids
    theirs = np.load(inputs + ".hf.npz")
    ours = model(tf.constant(batch)).numpy()[:, :, :config.vocab_size]
    assert np.abs(ours - theirs["logits"]).max() <= 1e-4
    our_tokens = generate_tokens(model, config, prompts.tolist(), 32, temperature=0.0)
    assert theirs["generated"].tolist() == our_tokens


@requires_hf_venv
def test_import_of_a_transformers_checkpoint_gives_transformers_loss(exported, tmp_path):
    from lm.training.train import token_loss

    _, _, export_dir, _ = exported
    hf_dir, ours = str(tmp_path / "hf"), str(tmp_path / "export")
    batch = np.random.default_rng(2).integers(0, 300, [3, 33]).astype(np.int32)
    inputs = str(tmp_path / "inputs.npz")
    np.savez(inputs, batch=batch)
    theirs = run_hf_side("make_random", hf_dir, os.path.join(export_dir, "tokenizer.json"), inputs)["loss"]
    subprocess.run([sys.executable, "-m", "lm.hf", "--from-hf", hf_dir, ours], check=True,
                   cwd=os.path.join(ROOT, "training_image"))
    model, config, tokenizer = lm_export.load_exported(ours)
    assert (config.n_layer, config.d_model, config.n_head, config.block_size) == (2, 32, 4, 64)
    assert config.padded_vocab_size == config.vocab_size == 300
    logits = model(tf.constant(batch[:, :-1]), training=True)
    loss = float(token_loss(tf)(tf.constant(batch[:, 1:]), logits))
    assert abs(loss - theirs) <= 1e-5 * max(1.0, abs(theirs))
    assert tokenizer.to_str() == lm_export.load_exported(export_dir)[2].to_str()


@pytest.mark.parametrize("change, message", [
    ({"model_type": "bert"}, "model_type 'bert'; the families that import a Hugging Face layout read model_type "
                             r"'gpt2' \(model gpt\), 'llama' \(model llama\)"),
    ({"activation_function": "relu"}, "activation_function"),
    ({"n_inner": 7}, "n_inner 7"), ({"tie_word_embeddings": False}, "tie_word_embeddings"),
])
def test_import_refuses_what_is_not_our_gpt2(tmp_path, exported, change, message):
    _, _, export_dir, _ = exported
    hf_dir = str(tmp_path / "hf")
    hf.export_hf(export_dir, hf_dir)
    with open(os.path.join(hf_dir, "config.json")) as f:
        values = json.load(f)
    values.update(change)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(values, f)
    with pytest.raises(hf.HFError, match=message):
        hf.import_hf(hf_dir, str(tmp_path / "export"))


def test_our_export_imports_back_to_the_same_logits_on_real_tokens(exported, tmp_path):
    model, config, export_dir, _ = exported
    hf_dir = str(tmp_path / "hf")
    hf.export_hf(export_dir, hf_dir)
    back, back_config, _ = lm_export.load_exported(hf.import_hf(hf_dir, str(tmp_path / "export")))
    assert back_config.vocab_size == config.vocab_size and back_config.padded_vocab_size == config.vocab_size
    tokens = tf.constant(np.random.default_rng(3).integers(0, config.vocab_size, [2, 16]).astype(np.int32))
    np.testing.assert_allclose(back(tokens).numpy(), model(tokens).numpy()[:, :, :config.vocab_size], atol=1e-5)
