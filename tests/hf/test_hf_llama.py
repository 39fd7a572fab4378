"""The llama family's Hugging Face conversion (lm.hf.llama through lm.hf and `python -m lm.hf`) against
transformers' own Llama: FlaxLlamaForCausalLM in .venv-hf (jax/flax on CPU), both directions,
logits within 1e-4. No fake here: the other side is the real library (tests/hf/hf_llama_side.py)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_hf_export import HF_PYTHON, ROOT, TEXT, requires_hf_venv

from controlplane.presets import get_preset
from lm import hf, models
from lm.compat import keras, tf
from lm.data.tokenizer import EOD_TOKEN, save, train_bpe
from lm.serving import export as lm_export
from lm.serving.generate import generate_tokens
from lm.spec.families import FAMILIES, families_with

SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_llama_side.py")
TRAINING_IMAGE = os.path.join(ROOT, "training_image")


def run_side(*args):
    """tests/hf/hf_llama_side.py in .venv-hf; returns its JSON line."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    result = subprocess.run([HF_PYTHON, SIDE] + list(args), capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    save(train_bpe(["%s %d" % (TEXT, i) for i in range(50)] + ["jumps over lazy dogs"], vocab_size=300), path)
    return path


def exported(tmp_path, tokenizer_file, **changes):
    """A llama-tiny (vocab 500 padded to 512) with every weight randomized (norm weights too, so a
    wrong mapping shows), exported by lm.serving.export."""
    keras.utils.set_random_seed(3)
    config = get_preset("llama-tiny").replace(vocab_size=500, **changes)
    model = models.build(config)
    rng = np.random.default_rng(0)
    for weight in model.weights:
        base = 1.0 if "layernorm" in weight.name or "/norm/" in weight.name else 0.0
        weight.assign(base + rng.normal(0, 0.3, weight.shape).astype(np.float32))
    export_dir = str(tmp_path / "export")
    lm_export.export_model(model, config, tokenizer_file, export_dir)
    return model, config, export_dir


def test_export_writes_the_llama_layout_and_cuts_padded_rows(tmp_path, tokenizer_file):
    model, config, export_dir = exported(tmp_path, tokenizer_file)
    out = hf.export_hf(export_dir, str(tmp_path / "hf"))
    tensors = hf.read_safetensors(os.path.join(out, "model.safetensors"))
    per_layer = ["input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                 "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert sorted(tensors) == sorted(["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"] + [
        "model.layers.%d.%s.weight" % (i, name) for i in range(config.n_layer) for name in per_layer])
    assert tensors["model.embed_tokens.weight"].shape == tensors["lm_head.weight"].shape == (500, 64)
    np.testing.assert_array_equal(tensors["lm_head.weight"], model.lm_head.kernel.numpy().T[:500])
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)  # [out, in]: 2 kv heads of 16
    with open(os.path.join(out, "config.json")) as f:
        values = json.load(f)
    assert (values["model_type"], values["architectures"], values["num_key_value_heads"], values["vocab_size"]) == (
        "llama", ["LlamaForCausalLM"], 2, 500)
    assert values["lmstack"]["padded_vocab_size"] == 512 and not values["tie_word_embeddings"]
    with open(os.path.join(out, "tokenizer_config.json")) as f:
        assert json.load(f)["eos_token"] == EOD_TOKEN
    tied = exported(tmp_path / "tied", tokenizer_file, tie_embeddings=True)[2]
    assert "lm_head.weight" not in hf.read_safetensors(
        os.path.join(hf.export_hf(tied, str(tmp_path / "tied-hf")), "model.safetensors"))


@requires_hf_venv
@pytest.mark.parametrize("changes", [{}, {"rope_theta": 500000.0, "tie_embeddings": True, "n_kv_head": 1}],
                         ids=["llama-tiny", "theta-500k-tied-one-kv-head"])
def test_transformers_llama_loads_the_export_with_the_same_logits_and_greedy_tokens(tmp_path, tokenizer_file,
                                                                                    changes):
    model, config, export_dir = exported(tmp_path, tokenizer_file, **changes)
    out = str(tmp_path / "hf")
    subprocess.run([sys.executable, "-m", "lm.hf", "--format", "hf", export_dir, out], check=True,
                   cwd=TRAINING_IMAGE)
    rng = np.random.default_rng(1)
    batch = rng.integers(0, config.vocab_size, [3, 40]).astype(np.int32)
    prompts = rng.integers(0, 300, [2, 5]).astype(np.int32)
    inputs = str(tmp_path / "inputs.npz")
    np.savez(inputs, batch=batch, prompts=prompts, text=np.array(TEXT))
    report = run_side("export", out, inputs)
    assert report["class"] == "FlaxLlamaForCausalLM" and report["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert report["config"] == {"num_key_value_heads": config.n_kv_head, "rope_theta": config.rope_theta,
                                "tie_word_embeddings": config.tie_embeddings}
    assert report["unexpected_keys"] == [] and report["missing_keys"] == (
        ["lm_head.kernel"] if config.tie_embeddings else [])  # tied: the head is the embedding
    _, _, tokenizer = lm_export.load_exported(export_dir)
    assert report["eos_token"] == EOD_TOKEN and report["ids"] == tokenizer.encode(TEXT).ids
    theirs = np.load(inputs + ".hf.npz")
    ours = model(tf.constant(batch)).numpy()[:, :, :config.vocab_size]
    assert np.abs(ours - theirs["logits"]).max() <= 1e-4
    assert theirs["generated"].tolist() == generate_tokens(model, config, prompts.tolist(), 32, temperature=0.0)


@requires_hf_venv
def test_import_of_a_transformers_llama_gives_transformers_logits(tmp_path, tokenizer_file):
    hf_dir, ours = str(tmp_path / "hf"), str(tmp_path / "export")
    batch = np.random.default_rng(2).integers(0, 300, [3, 33]).astype(np.int32)
    inputs = str(tmp_path / "inputs.npz")
    np.savez(inputs, batch=batch)
    theirs = run_side("make_random", hf_dir, tokenizer_file, inputs)
    subprocess.run([sys.executable, "-m", "lm.hf", "--from-hf", hf_dir, ours], check=True, cwd=TRAINING_IMAGE)
    model, config, tokenizer = lm_export.load_exported(ours)
    assert (config.family, config.n_layer, config.d_model, config.n_head, config.n_kv_head, config.d_ff) == (
        "llama", 2, 32, 4, 2, 88)
    assert config.padded_vocab_size == config.vocab_size == 300 and model.count_params() == theirs["parameters"]
    logits = model(tf.constant(batch[:, :-1])).numpy()
    assert np.abs(logits - np.load(inputs + ".hf.npz")["logits"]).max() <= 1e-4
    from lm.training.train import token_loss
    loss = float(token_loss(tf)(tf.constant(batch[:, 1:]), tf.constant(logits)))
    assert abs(loss - theirs["loss"]) <= 1e-5 * max(1.0, abs(theirs["loss"]))


def _hf_config_with(tmp_path, tokenizer_file, **change):
    _, _, export_dir = exported(tmp_path, tokenizer_file)
    hf_dir = hf.export_hf(export_dir, str(tmp_path / "hf"))
    with open(os.path.join(hf_dir, "config.json")) as f:
        values = json.load(f)
    values.update(change)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(values, f)
    return hf_dir


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"), ({"attention_bias": True}, "attention_bias"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 32.0}}, "rope_scaling .*unscaled"),
    ({"head_dim": 32}, "head_dim 32"), ({"num_key_value_heads": 3}, r"n_head \(4\) must be divisible by n_kv_head"),
])
def test_import_refuses_what_lm_llama_does_not_compute(tmp_path, tokenizer_file, change, message):
    hf_dir = _hf_config_with(tmp_path, tokenizer_file, **change)
    with pytest.raises(hf.HFError, match="config.json: .*" + message):
        hf.import_hf(hf_dir, str(tmp_path / "back"))


def test_init_from_needs_a_checkpoint_of_the_preset_family_and_shape(tmp_path, tokenizer_file):
    hf_dir = _hf_config_with(tmp_path, tokenizer_file)
    config = hf.init_config(hf_dir, get_preset("llama-tiny"), "preset llama-tiny")
    assert (config.family, config.vocab_size, config.pad_vocab_to) == ("llama", 500, 1)
    with pytest.raises(hf.HFError, match=r"model_type 'llama' is not the Hugging Face layout of model gpt "
                                         r"\(model_type 'gpt2'\): init_from must be a checkpoint of the family"):
        hf.init_config(hf_dir, get_preset("tiny"), "preset tiny")
    with pytest.raises(hf.HFError, match=r"not preset llama3.2-1b: n_layer 2 \(checkpoint\) vs 16.*n_kv_head 2 "
                                         r"\(checkpoint\) vs 8; d_ff 176 \(checkpoint\) vs 8192"):
        hf.init_config(hf_dir, get_preset("llama3.2-1b"), "preset llama3.2-1b")


def test_init_from_a_gpt2_checkpoint_with_a_llama_preset_is_refused(tmp_path, tokenizer_file):
    config = get_preset("tiny")
    export_dir = lm_export.export_model(models.build(config), config, tokenizer_file, str(tmp_path / "gpt"))
    gpt2_dir = hf.export_hf(export_dir, str(tmp_path / "gpt2"))
    with pytest.raises(hf.HFError, match=r"model_type 'gpt2' is not the Hugging Face layout of model llama "
                                         r"\(model_type 'llama'\): init_from must be a checkpoint of the family"):
        hf.init_config(gpt2_dir, get_preset("llama-tiny"), "preset llama-tiny")


def test_the_rnn_family_has_no_hugging_face_layout(tmp_path, tokenizer_file):
    config = get_preset("rnn-tiny")
    export_dir = lm_export.export_model(models.build(config), config, tokenizer_file, str(tmp_path / "e"))
    with pytest.raises(hf.HFError, match=r"model rnn cannot use the Hugging Face export \(capability hf_export: "
                                         r".*\); families with it: gpt, llama"):
        hf.export_hf(export_dir, str(tmp_path / "hf"))


def test_every_declared_hugging_face_layout_is_a_module_of_lm_hf():
    """A family's hf_model_type names a layout lm.hf has, and lm.hf has no layout no family declares."""
    declared = {FAMILIES[name].hf_model_type for name in families_with("hf_export") + families_with("hf_import")}
    assert declared == set(hf.LAYOUTS) == {"gpt2", "llama"}
    assert hf.family_layout("llama") is hf.llama.LAYOUT and hf.family_layout("gpt") is hf.gpt2.LAYOUT


def test_export_hf_tgi_and_lmi_take_the_llama_family_with_its_grouped_kv_cache():
    from controlplane import containers, presets, rules
    from lm.spec import conditions, job

    model_config = presets.get_preset("llama-tiny").to_dict()
    assert job.validate_hyperparameters({"model": "llama", "model_config": model_config, "export_hf": True})[
        "export_hf"]
    # llama3-8b in fp16: 8,030,261,248 parameters x 2 bytes; the KV cache of 8192 tokens holds the
    # 8 key/value heads of 128 (2 x 32 layers x 8 x 128 x 8192 x 2 bytes = 1 GiB, a quarter of 32
    # heads'); 2 GiB overhead. An A10G (24 GiB, 21.6 usable) holds it; a V100 (16 GiB) does not.
    config = get_preset("llama3-8b")
    assert containers.memory_per_gpu_gib(config, 1) == pytest.approx(8030261248 * 2 / 2 ** 30 + 1 + 2)
    assert containers.gpu_shards(containers.TGI, config, "ml.g5.2xlarge") == (1, None)
    assert containers.gpu_shards(containers.LMI, config, "ml.p3.2xlarge")[0] is None
    table = rules.cross_field_rules()
    request = {"preset": "llama2-13b", "hyperparameters": {"export_hf": True, "model": "llama"},
               "deploy": {"enabled": True, "container": "tgi", "instance_type": "ml.g5.2xlarge"}}
    assert "cannot serve preset 'llama2-13b' on deploy.instance_type ml.g5.2xlarge" in conditions.broken(
        table, request)
    assert conditions.broken(table, dict(request, deploy=dict(request["deploy"], instance_type="ml.g5.12xlarge"))) \
        is None
