import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lm.models import gpt as lm_model
from lm.compat import keras, tf
from controlplane.presets import GPT_PRESETS, get_preset
from lm.spec.families import GPTConfig, parameter_count

TINY = get_preset("tiny")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
IMAGE_DIR = os.path.join(ROOT, "training_image")
SEED_STYLE = dict(norm="post", activation="relu")


def small(**changes):
    return TINY.replace(**changes)


def tokens(config, batch=2, length=12, seed=0):
    return tf.constant(np.random.RandomState(seed).randint(0, config.vocab_size, size=(batch, length)), tf.int32)


def test_presets_have_the_gpt3_shapes():
    shapes = {name: (c.n_layer, c.d_model, c.n_head, c.block_size) for name, c in GPT_PRESETS.items()}
    assert shapes["gpt-125m"] == (12, 768, 12, 2048)
    assert shapes["gpt-1.3b"] == (24, 2048, 16, 2048)
    assert shapes["gpt-13b"] == (40, 5120, 40, 2048)
    assert GPT_PRESETS["gpt-125m"].padded_vocab_size == 50304


@pytest.mark.tf26
def test_logits_shape_and_dtype(seeded):
    model = lm_model.build_model(TINY)
    logits = model(tokens(TINY, batch=3, length=10))
    assert logits.shape == (3, 10, TINY.padded_vocab_size)
    assert logits.dtype == tf.float32
    assert np.isfinite(logits.numpy()).all()


@pytest.mark.tf26
@pytest.mark.parametrize("changes", [{}, SEED_STYLE], ids=["pre-ln", "post-ln"])
def test_changing_token_k_never_changes_earlier_logits(seeded, changes):
    config = small(**changes)
    model = lm_model.build_model(config)
    x = tokens(config, batch=1, length=16).numpy()
    base = model(x).numpy()
    for k in (0, 5, 15):
        changed = x.copy()
        changed[0, k] = (changed[0, k] + 1) % config.vocab_size
        out = model(changed).numpy()
        np.testing.assert_allclose(out[:, :k], base[:, :k], rtol=0, atol=1e-5)
        assert np.abs(out[:, k] - base[:, k]).max() > 1e-4


# GPT-3 paper, Table 2.1: nominal sizes. Our counts include the vocabulary padded to 50304.
GPT3_TABLE = {"gpt-125m": 125e6, "gpt-350m": 350e6, "gpt-760m": 760e6, "gpt-1.3b": 1.3e9,
              "gpt-2.7b": 2.7e9, "gpt-6.7b": 6.7e9, "gpt-13b": 13.0e9}


@pytest.mark.parametrize("name", sorted(GPT3_TABLE))
def test_parameter_formula_matches_the_gpt3_table(name):
    assert parameter_count(get_preset(name)) == pytest.approx(GPT3_TABLE[name], rel=0.03)


@pytest.mark.tf26
@pytest.mark.parametrize("changes", [
    {}, {"tie_embeddings": False}, dict(SEED_STYLE, head_dim=64), {"head_dim": 8},
    {"n_layer": 3, "d_model": 48, "n_head": 6, "vocab_size": 300, "pad_vocab_to": 128, "block_size": 40},
], ids=["tiny", "untied", "seed-style", "narrow-heads", "odd-shapes"])
def test_built_parameter_count_equals_the_formula(changes):
    config = small(**changes)
    model = lm_model.build_model(config)
    assert model.count_params() == parameter_count(config)
    embeddings = config.padded_vocab_size * config.d_model + config.block_size * config.d_model
    head = 0 if config.tie_embeddings else config.padded_vocab_size * config.d_model
    assert model.count_params() - embeddings - head == config.non_embedding_parameter_count()


def test_seed_style_heads_use_the_full_width():
    config = small(head_dim=TINY.d_model, **SEED_STYLE)
    model = lm_model.build_model(config)
    qkv = model.blocks[0].attention.qkv_kernel
    assert qkv.shape == (config.d_model, 3 * config.n_head * config.d_model)
    standard = lm_model.build_model(TINY).blocks[0].attention.qkv_kernel
    assert standard.shape == (TINY.d_model, 3 * TINY.d_model)


@pytest.mark.tf26
def test_output_projection_is_tied_to_the_token_embedding(seeded):
    x = tokens(TINY)
    tied = lm_model.build_model(TINY)
    tied.embedding.token_table.assign(tf.zeros_like(tied.embedding.token_table))
    assert np.abs(tied(x).numpy()).max() == 0.0
    untied = lm_model.build_model(small(tie_embeddings=False))
    untied.embedding.token_table.assign(tf.zeros_like(untied.embedding.token_table))
    assert np.abs(untied(x).numpy()).max() > 0.0
    matrices = [w for w in tied.weights if TINY.padded_vocab_size in w.shape]
    assert [w.name for w in matrices] == [tied.embedding.token_table.name]


def _gradients(model, x, seed):
    tf.random.set_seed(seed)
    with tf.GradientTape() as tape:
        logits = model(x[:, :-1], training=True)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(x[:, 1:], logits))
    return loss, tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_recompute_gives_the_same_gradients(dropout):
    config = small(dropout=dropout)
    plain = lm_model.build_model(config)
    recomputed = lm_model.build_model(config, recompute=True)
    recomputed.set_weights(plain.get_weights())
    x = tokens(config, length=17)
    loss_a, grads_a = _gradients(plain, x, seed=3)
    loss_b, grads_b = _gradients(recomputed, x, seed=3)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-6)
    assert all(g is not None for g in grads_b)
    for a, b in zip(grads_a, grads_b):
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(),
                                   rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_recompute_works_inside_a_compiled_train_step():
    config = small(dropout=0.1)
    model = lm_model.build_model(config, recompute=True)
    x = tokens(config, length=9)

    @tf.function
    def step():
        return _gradients(model, x, seed=1)

    loss, grads = step()
    assert np.isfinite(float(loss)) and all(g is not None for g in grads)


@pytest.mark.slow
@pytest.mark.parametrize("recompute", [False, True])
def test_xla_compiled_step_matches_the_plain_one(recompute):
    model = lm_model.build_model(TINY, recompute=recompute)
    x = tokens(TINY, length=13)
    plain = _gradients(model, x, seed=1)
    compiled = tf.function(lambda: _gradients(model, x, seed=1), jit_compile=True)()
    assert float(compiled[0]) == pytest.approx(float(plain[0]), rel=1e-5)
    for a, b in zip(plain[1], compiled[1]):
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(),
                                   rtol=1e-3, atol=1e-5)


@pytest.mark.tf26
def test_dropout_is_active_only_in_training(seeded):
    model = lm_model.build_model(small(dropout=0.5))
    x = tokens(TINY)
    np.testing.assert_array_equal(model(x).numpy(), model(x, training=False).numpy())
    assert np.abs(model(x, training=True).numpy() - model(x).numpy()).max() > 1e-3


@pytest.mark.tf26
def test_logits_stay_float32_under_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = lm_model.build_model(TINY)
        logits = model(tokens(TINY))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.blocks[0].attention.qkv_kernel.dtype == tf.float32
    assert logits.dtype == tf.float32 and np.isfinite(logits.numpy()).all()


@pytest.mark.tf26
def test_config_round_trip():
    model = lm_model.build_model(small(norm="post"), recompute=True)
    clone = lm_model.GPT.from_config(model.get_config())
    assert clone.model_config == model.model_config and clone.recompute
    assert lm_model.Block.from_config(model.blocks[0].get_config()).norm == "post"


@pytest.mark.slow
def test_cli_prints_the_size_of_a_big_preset_without_building_it():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, IMAGE_DIR]))
    out = subprocess.run([sys.executable, "-m", "lmstack.plan", "--describe", "gpt-1.3b"], env=env,
                         capture_output=True, text=True, check=True).stdout
    info = json.loads(out)
    config = get_preset("gpt-1.3b")
    assert info["params"] == parameter_count(config)
    assert info["n_layer"] == 24 and info["d_model"] == 2048 and info["n_head"] == 16
    # 6 x (the blocks' matmul weights, 12 d^2 each, + the output projection) + 12 L T d
    expected_flops = 6 * (24 * 12 * 2048 ** 2 + 50304 * 2048) + 12 * 24 * 2048 * 2048
    assert info["flops_per_token"] == expected_flops


@pytest.mark.slow
def test_cli_describes_other_families_too():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, IMAGE_DIR]))
    out = subprocess.run([sys.executable, "-m", "lmstack.plan", "--describe", "rnn-small"], env=env,
                         capture_output=True, text=True, check=True).stdout
    info = json.loads(out)
    assert info["family"] == "rnn" and info["params"] == parameter_count(get_preset("rnn-small"))


@pytest.mark.slow
def test_cli_names_the_allowed_presets_for_an_unknown_one():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, IMAGE_DIR]))
    result = subprocess.run([sys.executable, "-m", "lmstack.plan", "--describe", "gpt-9"], env=env,
                            capture_output=True, text=True)
    assert result.returncode != 0 and "unknown preset 'gpt-9'; allowed: tiny, gpt-125m" in result.stderr
    assert "rnn-small" in result.stderr


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="norm"):
        GPTConfig(n_layer=1, d_model=8, n_head=2, norm="middle")
