"""The llama family's Hugging Face conversion (lm.hf.llama through lm.hf and `python -m lm.hf`) against
transformers' own PyTorch LlamaForCausalLM in .venv-hf (torch on CPU, float32), both directions,
logits within 1e-4 and the same greedy tokens: our exports (float32, and bfloat16 in shards with
Llama 3.2's features), and checkpoints as releases are published (bfloat16, sharded, "llama3" rope
scaling, grouped-query attention with a tied head), written by transformers' save_pretrained.
No fake here: the other side is the real library (tests/hf/hf_llama_side.py)."""
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
from lm.tokenizer import EOD_TOKEN, save, train_bpe
from lm.hf.files import bfloat16_bits
from lm.serving import export as lm_export
from lm.serving.generate import generate_tokens
from lm.spec.families import FAMILIES, families_with
from family_cases import having_message

SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_llama_side.py")
TRAINING_IMAGE = os.path.join(ROOT, "training_image")
GENERATED_TOKENS = 16  # hf_llama_side.GENERATED_TOKENS
# "llama3" rope scaling at a tiny scale: positions past 16 / 4 rotate differently from unscaled ones.
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}


def run_side(*args):
    """tests/hf/hf_llama_side.py in .venv-hf; returns its JSON line."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(USE_TF="0", USE_TORCH="1", TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    result = subprocess.run([HF_PYTHON, SIDE] + list(args), capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    save(train_bpe(["%s %d" % (TEXT, i) for i in range(50)] + ["jumps over lazy dogs"], vocab_size=300), path)
    return path


def to_bfloat16(array):
    """The float32 values of `array` rounded to bfloat16 (what a bfloat16 export stores)."""
    return (bfloat16_bits(array).astype(np.uint32) << 16).view(np.float32)


def exported(tmp_path, tokenizer_file, bfloat16=False, **changes):
    """A llama-tiny (vocab 500 padded to 512) with every weight randomized (norm weights too, so a
    wrong mapping shows), exported by lm.serving.export; with `bfloat16` the weights are bfloat16
    values, so a bfloat16 export holds them exactly."""
    keras.utils.set_random_seed(3)
    config = get_preset("llama-tiny").replace(vocab_size=500, **changes)
    model = models.build(config)
    rng = np.random.default_rng(0)
    for weight in model.weights:
        base = 1.0 if "layernorm" in weight.name or "/norm/" in weight.name else 0.0
        value = base + rng.normal(0, 0.3, weight.shape).astype(np.float32)
        weight.assign(to_bfloat16(value) if bfloat16 else value)
    export_dir = str(tmp_path / "export")
    lm_export.export_model(model, config, tokenizer_file, export_dir)
    return model, config, export_dir


def test_export_writes_the_llama_layout_in_bfloat16_and_cuts_padded_rows(tmp_path, tokenizer_file):
    model, config, export_dir = exported(tmp_path, tokenizer_file)
    out = hf.export_hf(export_dir, str(tmp_path / "hf"))
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert {entry["dtype"] for name, entry in header.items() if name != "__metadata__"} == {"BF16"}
    tensors = hf.read_safetensors(os.path.join(out, "model.safetensors"))
    per_layer = ["input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                 "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert sorted(tensors) == sorted(["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"] + [
        "model.layers.%d.%s.weight" % (i, name) for i in range(config.n_layer) for name in per_layer])
    assert tensors["model.embed_tokens.weight"].shape == tensors["lm_head.weight"].shape == (500, 64)
    np.testing.assert_array_equal(tensors["lm_head.weight"], to_bfloat16(model.lm_head.kernel.numpy().T[:500]))
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)  # [out, in]: 2 kv heads of 16
    with open(os.path.join(out, "config.json")) as f:
        values = json.load(f)
    assert (values["model_type"], values["architectures"], values["num_key_value_heads"], values["vocab_size"]) == (
        "llama", ["LlamaForCausalLM"], 2, 500)
    assert values["lmstack"]["padded_vocab_size"] == 512 and not values["tie_word_embeddings"]
    assert values["torch_dtype"] == "bfloat16" and values["rope_scaling"] is None
    with open(os.path.join(out, "tokenizer_config.json")) as f:
        assert json.load(f)["eos_token"] == EOD_TOKEN
    exact = hf.export_hf(export_dir, str(tmp_path / "fp32"), dtype="float32")
    np.testing.assert_array_equal(hf.read_safetensors(os.path.join(exact, "model.safetensors"))["lm_head.weight"],
                                  model.lm_head.kernel.numpy().T[:500])
    tied = exported(tmp_path / "tied", tokenizer_file, tie_embeddings=True)[2]
    assert "lm_head.weight" not in hf.read_safetensors(
        os.path.join(hf.export_hf(tied, str(tmp_path / "tied-hf")), "model.safetensors"))


@requires_hf_venv
@pytest.mark.parametrize("changes, dtype, max_shard_size", [
    ({}, "float32", None),
    ({"rope_theta": 500000.0, "tie_embeddings": True, "n_kv_head": 1, "rope_scaling": LLAMA3_SCALING}, None, "40KB"),
], ids=["llama-tiny-float32", "bfloat16-shards-llama3-scaling-theta-500k-tied-one-kv-head"])
def test_transformers_llama_loads_the_export_with_the_same_logits_and_greedy_tokens(tmp_path, tokenizer_file,
                                                                                    changes, dtype, max_shard_size):
    model, config, export_dir = exported(tmp_path, tokenizer_file, bfloat16=dtype is None, **changes)
    out = str(tmp_path / "hf")
    options = (["--dtype", dtype] if dtype else []) + (["--max-shard-size", max_shard_size] if max_shard_size else [])
    subprocess.run([sys.executable, "-m", "lm.hf", "--format", "hf", export_dir, out] + options, check=True,
                   cwd=TRAINING_IMAGE)
    rng = np.random.default_rng(1)
    batch = rng.integers(0, config.vocab_size, [3, 40]).astype(np.int32)
    prompts = rng.integers(0, 300, [2, 5]).astype(np.int32)
    # PyTorch's rounding to bfloat16 of ties, the largest finite values, infinities, NaN and denormals
    edges = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.4028235e38, -3.4028235e38, np.inf, -np.inf,
                      np.nan, 1e-40, -1e-45, 0.0, -0.0], np.float32)
    rounding = np.concatenate([edges, rng.normal(0, 10, 4000).astype(np.float32)])
    inputs = str(tmp_path / "inputs.npz")
    np.savez(inputs, batch=batch, prompts=prompts, text=np.array(TEXT), round=rounding)
    report = run_side("export", out, inputs)
    assert report["class"] == "LlamaForCausalLM" and report["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert report["config"] == {"num_key_value_heads": config.n_kv_head, "rope_theta": config.rope_theta,
                                "tie_word_embeddings": config.tie_embeddings, "rope_scaling": changes.get("rope_scaling")}
    assert report["tied"] == config.tie_embeddings
    assert report["missing_keys"] == report["unexpected_keys"] == report["mismatched_keys"] == []
    assert report["stored_dtypes"] == ["F32" if dtype == "float32" else "BF16"]  # as safetensors reads them
    if max_shard_size:
        shards = [name for name in report["files"] if name.startswith("model-")]
        assert len(shards) > 1 and "model.safetensors.index.json" in report["files"]
        assert "model.safetensors" not in report["files"]
    _, _, tokenizer = lm_export.load_exported(export_dir)
    assert report["eos_token"] == EOD_TOKEN and report["ids"] == tokenizer.encode(TEXT).ids
    theirs = np.load(inputs + ".hf.npz")
    number = ~np.isnan(rounding)  # a NaN's bits are PyTorch's choice (its vectorized path writes 0xffff)
    np.testing.assert_array_equal(theirs["rounded"][number], bfloat16_bits(rounding)[number])
    assert ((bfloat16_bits(rounding)[~number] & 0x7F80) == 0x7F80).all() and (bfloat16_bits(rounding)[~number] & 0x7F).all()
    ours = model(tf.constant(batch)).numpy()[:, :, :config.vocab_size]
    assert np.abs(ours - theirs["logits"]).max() <= 1e-4
    assert theirs["generated"].tolist() == generate_tokens(model, config, prompts.tolist(), GENERATED_TOKENS,
                                                           temperature=0.0)


def write_hf_config(hf_dir, config, **overrides):
    """The config.json lm.hf writes for `config` (with `overrides`), alone in `hf_dir`."""
    os.makedirs(hf_dir)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(dict(hf.LAYOUTS["llama"].hf_config(config, 0), **overrides), f)
    return hf_dir


@requires_hf_venv
def test_transformers_loads_the_exported_llama_3_2_config_without_a_warning(tmp_path):
    """The Llama 3.2 presets declare the release's 131072 positions (their block_size is the 8192 of
    rope scaling's original_max_position_embeddings), and factors given as ints are written as floats:
    transformers' rope validation warns at neither. The last directory holds the config.json written
    before (max_position_embeddings 8192, int factors): the warnings it gets show the check sees them."""
    integers = dict(LLAMA3_SCALING, factor=8, low_freq_factor=1, high_freq_factor=4)
    configs = {name: get_preset(name) for name in ("llama3.2-1b", "llama3.2-3b")}
    configs["llama-tiny-int-factors"] = get_preset("llama-tiny").replace(rope_scaling=integers)
    dirs = {name: write_hf_config(str(tmp_path / name), config) for name, config in configs.items()}
    before = write_hf_config(str(tmp_path / "before"), configs["llama3.2-1b"], max_position_embeddings=8192,
                             rope_scaling=dict(integers, original_max_position_embeddings=8192))
    report = run_side("config", before, *dirs.values())
    for name, config in configs.items():
        loaded = report[dirs[name]]
        assert loaded["warnings"] == [], (name, loaded)
        assert loaded["max_position_embeddings"] == (131072 if name.startswith("llama3.2") else config.block_size)
        assert all(isinstance(loaded["rope_scaling"][field], float)
                   for field in ("factor", "low_freq_factor", "high_freq_factor"))
    warned = " ".join(report[before]["warnings"])
    assert all(field in warned for field in ("factor", "low_freq_factor", "high_freq_factor",
                                             "original_max_position_embeddings")), warned


@requires_hf_venv
def test_checkpoints_as_published_import_with_transformers_logits_loss_and_greedy_tokens(tmp_path, tokenizer_file):
    """bfloat16; bfloat16 in shards; "llama3" rope scaling on 64-token sequences, four times the 16 positions it
    keeps unscaled; Llama 3.2 1B's shape in miniature (four query heads per key/value head, tied head,
    rope_theta 500000, llama3 scaling, bfloat16 shards). Written by transformers' save_pretrained."""
    from lm.training.train import token_loss

    rng = np.random.default_rng(2)
    batch = rng.integers(0, 300, [3, 65]).astype(np.int32)
    prompts = rng.integers(0, 300, [2, 5]).astype(np.int32)
    inputs = str(tmp_path / "inputs.npz")
    np.savez(inputs, batch=batch, prompts=prompts)
    report = run_side("make_published", str(tmp_path), tokenizer_file, inputs)
    theirs = np.load(inputs + ".hf.npz")
    assert sorted(report) == ["bf16", "llama-3.2-like", "rope-scaling-llama3", "sharded"]
    assert report["bf16"]["stored_dtypes"] == report["sharded"]["stored_dtypes"] == ["BF16"]
    for name in ("sharded", "llama-3.2-like"):
        assert "model.safetensors.index.json" in report[name]["files"] and "model.safetensors" not in report[name]["files"]
    for name in ("rope-scaling-llama3", "llama-3.2-like"):
        assert report[name]["unscaled_max_logit_change"] > 0.05  # the scaling changes these logits
    for name, expected in report.items():
        ours = str(tmp_path / (name + "-export"))
        if name == "sharded":  # the command line once; the library the other times
            subprocess.run([sys.executable, "-m", "lm.hf", "--from-hf", str(tmp_path / name), ours], check=True,
                           cwd=TRAINING_IMAGE)
        else:
            hf.import_hf(str(tmp_path / name), ours)
        model, config, _ = lm_export.load_exported(ours)
        assert config.family == "llama" and config.padded_vocab_size == config.vocab_size == 300
        assert model.count_params() == expected["parameters"]
        logits = model(tf.constant(batch[:, :-1])).numpy()
        assert np.abs(logits - theirs[name + "/logits"]).max() <= 1e-4, name
        loss = float(token_loss(tf)(tf.constant(batch[:, 1:]), tf.constant(logits)))
        assert abs(loss - expected["loss"]) <= 1e-5 * max(1.0, abs(expected["loss"])), name
        assert theirs[name + "/generated"].tolist() == generate_tokens(
            model, config, prompts.tolist(), GENERATED_TOKENS, temperature=0.0), name
    model, config, _ = lm_export.load_exported(str(tmp_path / "llama-3.2-like-export"))
    assert (config.n_head, config.n_kv_head, config.tie_embeddings, config.rope_theta) == (8, 2, True, 500000.0)
    assert config.to_dict()["rope_scaling"] == LLAMA3_SCALING


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
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_scaling.rope_type must be one of llama3 "
                                                             r"\(or rope_scaling null\), got 'yarn'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 32.0}}, r"rope_scaling: rope_type llama3 takes the fields"),
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
                                         r".*\); " + having_message("hf_export")):
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
