"""The Llama family (lm.spec.families.llama, lm.models.llama, its presets in controlplane.presets):
parameter counts against the released models, the planner interface, the model's shapes,
causality, grouped-query attention, the key/value cache and recomputation. Its conventions against
transformers' own Llama: tests/hf/test_hf_llama.py."""
import numpy as np
import pytest

from controlplane import presets
from lm import models
from lm.compat import keras, tf
from lm.models.llama import Llama
from lm.serving import generate as lm_generate
from lm.spec import families as lm_config
from lm.spec.families import LlamaConfig

TINY = presets.get_preset("llama-tiny")

# Parameters of the released checkpoints: the Hugging Face Hub's safetensors totals of
# meta-llama/<repo> (the API's `safetensors.total`, "Model size" on the model page), whose
# config.json gives each preset's shape. Llama 3.2 ties the head to the embedding (counted once).
PUBLISHED = {
    "llama3.2-1b": ("Llama-3.2-1B", 1235814400),
    "llama3.2-3b": ("Llama-3.2-3B", 3212749824),
    "llama2-7b": ("Llama-2-7b-hf", 6738415616),
    "llama3-8b": ("Meta-Llama-3-8B", 8030261248),
    "llama2-13b": ("Llama-2-13b-hf", 13015864320),
}


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_preset_parameter_counts_are_the_published_ones(preset):
    assert lm_config.parameter_count(presets.get_preset(preset, "llama")) == PUBLISHED[preset][1]


@pytest.mark.parametrize("preset", sorted(PUBLISHED) + ["llama-tiny"])
def test_the_planner_interface_counts_what_one_block_holds_and_computes(preset):
    """block_parameter_count is parameter_count's per-layer share (one layer more adds exactly it);
    block_forward_flops is 2 FLOPs per parameter of the block's matmuls and token, plus the
    [t, t] products of every query head (4 * b * t^2 * d), the same as GPT's for the same shape."""
    config = presets.get_preset(preset)
    deeper = config.replace(n_layer=config.n_layer + 1)
    assert deeper.parameter_count() - config.parameter_count() == config.block_parameter_count()
    matmul_parameters = config.block_parameter_count() - 2 * config.d_model  # less the RMSNorm weights
    batch, seq_len = 2, 64
    assert config.block_forward_flops(batch, seq_len) == (
        2 * batch * seq_len * matmul_parameters + 4 * batch * seq_len * seq_len * config.d_model)
    # grouped-query attention: fewer key/value heads, fewer parameters and FLOPs, fewer bytes kept
    full = config.replace(n_kv_head=config.n_head)
    assert (full.block_parameter_count() > config.block_parameter_count()) == (config.n_kv_head < config.n_head)
    assert full.block_activation_bytes(1, seq_len, 2) >= config.block_activation_bytes(1, seq_len, 2) > 0
    assert config.replace(dropout=0.1).block_activation_bytes(1, seq_len, 2) > config.block_activation_bytes(
        1, seq_len, 2)


def test_the_presets_are_registered_and_the_tiny_one_has_the_demo_shape():
    from lm.spec.families import llama
    assert presets.FAMILY_PRESETS["llama"] is llama.PRESETS  # the family module's presets, registered
    assert set(llama.PRESETS) == set(PUBLISHED) | {"llama-tiny"}
    gpt_tiny = presets.get_preset("tiny")
    assert (TINY.vocab_size, TINY.block_size, TINY.padded_vocab_size) == (
        gpt_tiny.vocab_size, gpt_tiny.block_size, gpt_tiny.padded_vocab_size)
    assert TINY.n_kv_head < TINY.n_head and not TINY.tie_embeddings


@pytest.mark.parametrize("changes", [{}, {"tie_embeddings": True}, {"n_kv_head": 1}, {"n_kv_head": 4, "d_ff": 40}])
def test_the_model_has_the_counted_parameters_and_the_interface_of_every_family(changes):
    config = TINY.replace(**changes)
    model = models.build(config)
    assert isinstance(model, Llama) and lm_config.get_family("llama").supports("kv_cache")
    assert model.count_params() == lm_config.parameter_count(config)
    out = model(tf.zeros([3, 7], tf.int32))
    assert out.shape == (3, 7, config.padded_vocab_size) and out.dtype == tf.float32
    assert not [w for w in model.weights if "bias" in w.name]


def test_grouped_query_attention_is_attention_with_each_key_value_head_repeated_for_its_group():
    """Query head h uses key/value head h // (n_head // n_kv_head) (transformers' repeat_kv): the
    same model with n_kv_head = n_head and each k/v head copied to its group's heads is equal."""
    keras.utils.set_random_seed(5)
    grouped = models.build(TINY)
    full = models.build(TINY.replace(n_kv_head=TINY.n_head))
    group, head_dim = TINY.n_head // TINY.n_kv_head, TINY.head_dim
    for ours, theirs in zip(grouped.weights, full.weights):
        value = ours.numpy()
        if "k_kernel" in ours.name or "v_kernel" in ours.name:
            value = np.repeat(value.reshape(TINY.d_model, TINY.n_kv_head, head_dim), group, axis=1)
            value = value.reshape(TINY.d_model, -1)
        theirs.assign(value)
    tokens = np.random.default_rng(0).integers(0, TINY.vocab_size, [2, 12]).astype(np.int32)
    np.testing.assert_allclose(grouped(tokens).numpy(), full(tokens).numpy(), atol=1e-5)


def test_rotary_embeddings_make_query_key_products_depend_on_the_distance_only():
    """RoPE rotates each pair of dimensions by position * frequency: q at position i and k at j
    score the same for every (i, j) of the same distance, and position 0 leaves a vector unchanged."""
    from lm.models.llama import inverse_frequencies, rotary_angles, rotate

    rng = np.random.default_rng(1)
    q, k = (tf.constant(rng.normal(size=[1, 1, 1, TINY.head_dim]), tf.float32) for _ in range(2))
    frequencies = inverse_frequencies(TINY.head_dim, TINY.rope_theta)

    def score(i, j):
        rotated_q = rotate(q, *rotary_angles(tf.constant([[i]]), frequencies))
        rotated_k = rotate(k, *rotary_angles(tf.constant([[j]]), frequencies))
        return float(tf.reduce_sum(rotated_q * rotated_k))

    np.testing.assert_allclose(rotate(q, *rotary_angles(tf.constant([[0]]), frequencies)), q)
    assert abs(score(7, 3) - score(104, 100)) < 1e-4 and abs(score(7, 3) - score(3, 7)) > 1e-3


LLAMA_3_2_ROPE_SCALING = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"}


def test_llama3_rope_scaling_stretches_the_long_wavelengths_only():
    """Meta's rule (Llama 3.1's apply_scaling, transformers' _compute_llama3_parameters), written here
    in float64: wavelengths below 8192 / 4 kept, above 8192 / 1 stretched 32x, between interpolated.
    Checked against transformers' own LlamaForCausalLM in tests/hf/test_hf_llama.py."""
    from lm.models.llama import inverse_frequencies

    config = presets.get_preset("llama3.2-1b")
    scaling = config.rope_scaling
    plain = inverse_frequencies(config.head_dim, config.rope_theta)
    scaled = inverse_frequencies(config.head_dim, config.rope_theta, scaling)
    wavelengths = 2 * np.pi / plain.astype(np.float64)
    short, long = wavelengths < 8192 / 4, wavelengths > 8192 / 1
    assert short.any() and long.any() and (~short & ~long).any()
    np.testing.assert_array_equal(scaled[short], plain[short])
    np.testing.assert_allclose(scaled[long], plain[long] / 32, rtol=1e-6)
    smooth = (8192 / wavelengths - 1) / (4 - 1)
    between = ~short & ~long
    np.testing.assert_allclose(scaled[between], ((1 - smooth) * plain / 32 + smooth * plain)[between], rtol=1e-5)
    assert scaled.dtype == np.float32


def test_the_llama_3_2_presets_carry_llama_3_2s_rope_scaling_and_it_round_trips():
    for name in ("llama3.2-1b", "llama3.2-3b"):
        config = presets.get_preset(name)
        assert config.to_dict()["rope_scaling"] == LLAMA_3_2_ROPE_SCALING and config.rope_theta == 500000.0
        assert LlamaConfig.from_dict(config.to_dict()) == config
        # they train at the 8192 original positions and declare the release's context
        assert (config.block_size, config.supported_context) == (8192, 131072)
    assert presets.get_preset("llama3-8b").rope_scaling is None  # Meta-Llama-3-8B has none
    legacy = dict(LLAMA_3_2_ROPE_SCALING, type="llama3")
    del legacy["rope_type"]  # older config.json files name it "type"
    assert TINY.replace(rope_scaling=legacy).rope_scaling == presets.get_preset("llama3.2-1b").rope_scaling


@pytest.mark.parametrize("rope_scaling, message", [
    ({"rope_type": "linear", "factor": 2.0}, r"\.rope_type must be one of llama3 \(or rope_scaling null\), "
                                             r"got 'linear'"),
    (dict(LLAMA_3_2_ROPE_SCALING, factor=0.5), r"\.factor must be >= 1, got 0.5"),
    (dict(LLAMA_3_2_ROPE_SCALING, high_freq_factor=1.0), r"high_freq_factor \(1.0\) must be greater than low_freq_factor"),
    ({"rope_type": "llama3", "factor": 8.0}, r"missing \['low_freq_factor', 'high_freq_factor', "
                                             r"'original_max_position_embeddings'\]"),
    (dict(LLAMA_3_2_ROPE_SCALING, original_max_position_embeddings=8192.0), "original_max_position_embeddings must be a "
                                                                             "positive integer, got 8192.0"),
    ("llama3", " must be null or an object, got 'llama3'"),
])
def test_bad_rope_scaling_is_refused_naming_the_field(rope_scaling, message):
    with pytest.raises(ValueError, match="^LlamaConfig.rope_scaling.*" + message):
        TINY.replace(rope_scaling=rope_scaling)


def test_cached_decode_matches_full_logits_step_by_step():
    model = models.build(TINY)
    sequence = tf.constant([[5, 17, 3, 99, 42, 7, 8, 9, 10]])
    valid = tf.ones_like(sequence, tf.bool)
    full = model(sequence).numpy()
    caches = model.init_cache(1, 9)
    assert caches[0][0].shape == (1, TINY.n_kv_head, 9, TINY.head_dim)  # the cache holds the shared heads only
    logits, caches = model.decode(sequence[:, :6], valid, caches, 0)
    np.testing.assert_allclose(logits.numpy(), full[:, :6], atol=1e-5)
    for i in range(6, 9):
        logits, caches = model.decode(sequence[:, i:i + 1], valid, caches, i)
        np.testing.assert_allclose(logits.numpy()[:, 0], full[:, i], atol=1e-5)


@pytest.mark.parametrize("options", [dict(temperature=0), dict(temperature=1.0, top_k=40, seed=3)],
                         ids=["greedy", "sampled"])
def test_kv_cache_gives_the_same_tokens_as_full_recomputation_with_left_padding(options):
    model = models.build(TINY)
    prompts = [[5, 17, 3, 99, 42, 7], [11, 2], [300, 301, 302, 303]]
    cached = lm_generate.generate_tokens(model, TINY, prompts, 16, use_cache=True, **options)
    assert cached == lm_generate.generate_tokens(model, TINY, prompts, 16, use_cache=False, **options)
    alone = lm_generate.generate_tokens(model, TINY, [prompts[1]], 16, use_cache=True, **options)
    if not options.get("seed"):
        assert cached[1] == alone[0]


def test_recompute_gives_the_gradients_of_the_plain_model():
    keras.utils.set_random_seed(9)
    plain = models.build(TINY)
    recomputed = models.build(TINY, recompute=True)
    recomputed.set_weights(plain.get_weights())
    tokens = tf.constant(np.random.default_rng(2).integers(0, TINY.vocab_size, [2, 9]).astype(np.int32))

    def gradients(model):
        with tf.GradientTape() as tape:
            logits = model(tokens[:, :-1], training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tokens[:, 1:], logits))
        return tape.gradient(loss, model.trainable_variables)

    for a, b in zip(gradients(plain), gradients(recomputed)):
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(), atol=1e-6)


def test_dropout_masks_come_from_the_dropout_key():
    config = TINY.replace(dropout=0.3)
    model = models.build(config)
    tokens = tf.constant([[1, 2, 3, 4, 5, 6]])
    model.dropout_key = lambda: tf.constant([3, 4], tf.int64)
    first, again = model(tokens, training=True).numpy(), model(tokens, training=True).numpy()
    np.testing.assert_array_equal(first, again)
    model.dropout_key = lambda: tf.constant([3, 5], tf.int64)
    assert np.abs(model(tokens, training=True).numpy() - first).max() > 0
    np.testing.assert_array_equal(model(tokens).numpy(), model(tokens).numpy())


@pytest.mark.parametrize("changes, message", [
    ({"n_kv_head": 3}, r"n_head \(4\) must be divisible by n_kv_head \(3\)"),
    ({"d_model": 60}, r"d_model \(60\) must be n_head \(4\) times an even head size"),
    ({"rope_theta": 0}, "rope_theta must be a number > 0"),
    ({"d_ff": 0}, "LlamaConfig.d_ff must be a positive integer"),
    ({"max_position_embeddings": 8192.0}, "LlamaConfig.max_position_embeddings must be a positive integer"),
    ({"family": "gpt"}, "family must be 'llama'"),
])
def test_bad_configs_are_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        TINY.replace(**changes)


def test_config_round_trips_and_unknown_fields_are_refused():
    assert models.config_from_dict("llama", TINY.to_dict()) == TINY
    with pytest.raises(ValueError, match="unknown LlamaConfig fields \\['head_dim'\\]"):
        LlamaConfig.from_dict(dict(TINY.to_dict(), head_dim=16))


def test_lm_train_refuses_smp_for_llama_before_any_job():
    """lm.distributed.smp partitions the GPT's blocks (DistributedGPT): llama trains under single,
    horovod, mwms and smddp (tests/training/test_distributed.py, tests/smdist/test_smddp.py)."""
    from lm.training.train import parse_args

    tiny = presets.train_arguments("llama-tiny")
    with pytest.raises(ValueError, match="model llama cannot use strategy smp .capability smp"):
        parse_args(["--strategy", "smp", "--model", "llama", "--data-dir", "x"] + tiny)
    hyperparameters, _ = parse_args(["--strategy", "smddp", "--model", "llama", "--recompute", "true",
                                     "--data-dir", "x"] + tiny)
    assert (hyperparameters.model, hyperparameters.recompute) == ("llama", True)
