import json
import os
import pkgutil

import numpy as np
import pytest

from controlplane import presets
from family_cases import having_message, tiny_presets
from lm.spec import families as lm_config
from lm.serving import generate as lm_generate
from lm.spec import job
from lm import models
from lm.compat import keras, tf
from lm.models.rnn import RNNLM

RNN_TINY = presets.get_preset("rnn-tiny")


def test_the_registry_lists_the_families_and_the_job_reads_it():
    """Every module of lm.spec.families but the shared one is a family, found with no registry edit."""
    modules = {found.name for found in pkgutil.iter_modules([os.path.dirname(lm_config.__file__)])}
    assert set(lm_config.FAMILIES) == modules - set(lm_config.SHARED_MODULES) >= {"gpt", "rnn", "llama"}
    assert list(lm_config.FAMILIES)[0] == lm_config.DEFAULT_FAMILY == job.HYPERPARAMETERS["model"].default
    assert job.HYPERPARAMETERS["model"].choices == tuple(lm_config.FAMILIES)
    assert all(c.family == name for name, family in presets.FAMILY_PRESETS.items() for c in family.values())


def test_the_job_rejects_a_configuration_of_another_family():
    rnn_tiny = presets.get_preset("rnn-tiny").to_dict()
    assert job.validate_hyperparameters({"model": "rnn", "model_config": rnn_tiny})["model_config"] == rnn_tiny
    with pytest.raises(ValueError, match="hyperparameters.model_config is not a configuration of model rnn: "
                                         "unknown RNNConfig fields .'activation', 'head_dim', 'n_head', 'norm'."):
        job.validate_hyperparameters({"model": "rnn", "model_config": presets.get_preset("gpt-125m").to_dict()})
    with pytest.raises(ValueError, match="model_config is not a configuration of model gpt: GPTConfig.family must be"):
        job.validate_hyperparameters({"model": "gpt", "model_config": dict(presets.get_preset("tiny").to_dict(), family="rnn")})


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("tied", [True, False])
def test_rnn_builds_with_the_counted_parameters(cell, tied):
    config = RNN_TINY.replace(cell=cell, tie_embeddings=tied, n_layer=2)
    model = models.build(config)
    assert isinstance(model, RNNLM)
    assert model.count_params() == lm_config.parameter_count(config)
    out = model(tf.zeros([3, 7], tf.int32))
    assert out.shape == (3, 7, config.padded_vocab_size) and out.dtype == tf.float32


@pytest.mark.parametrize("preset", [preset for preset, _ in tiny_presets()])
def test_the_model_is_causal(preset):
    model = models.build(presets.get_preset(preset))
    x = np.arange(1, 11, dtype=np.int32)[np.newaxis]
    changed = x.copy()
    changed[0, 6] = 400
    a, b = model(x).numpy(), model(changed).numpy()
    np.testing.assert_array_equal(a[:, :6], b[:, :6])
    assert np.abs(a[:, 6] - b[:, 6]).max() > 0


def test_rnn_trains_a_step():
    keras.utils.set_random_seed(3)
    config = RNN_TINY.replace(dropout=0.1)
    model = models.build(config)
    optimizer = keras.optimizers.Adam(1e-2)
    x = tf.constant(np.random.RandomState(0).randint(0, 20, size=(4, 17)), tf.int32)

    def loss():
        out = model(x[:, :-1], training=True)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(x[:, 1:], out))

    losses = []
    for _ in range(5):
        with tf.GradientTape() as tape:
            value = loss()
        grads = tape.gradient(value, model.trainable_variables)
        assert all(g is not None for g in grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        losses.append(float(value))
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_rnn_generation_falls_back_to_recomputation_and_ignores_padding():
    model = models.build(RNN_TINY)
    prompts = [[1, 2, 3, 4, 5], [9, 8]]
    cached = lm_generate.generate_tokens(model, RNN_TINY, prompts, 4, temperature=0.8, seed=1)
    assert cached == lm_generate.generate_tokens(model, RNN_TINY, prompts, 4, temperature=0.8, seed=1,
                                                 use_cache=False)
    greedy = lm_generate.generate_tokens(model, RNN_TINY, prompts, 4, temperature=0)
    assert greedy[1] == lm_generate.generate_tokens(model, RNN_TINY, [prompts[1]], 4, temperature=0)[0]


def test_family_errors_name_the_allowed_values():
    with pytest.raises(ValueError, match="allowed: %s$" % ", ".join(lm_config.FAMILIES)):
        models.config_from_dict("bert", {})
    with pytest.raises(ValueError, match="cell must be one of gru, lstm"):
        RNN_TINY.replace(cell="elman")
    with pytest.raises(ValueError, match="rnn-tiny"):
        presets.get_preset("tiny", family="rnn")
    with pytest.raises(ValueError, match="recompute"):
        models.build(RNN_TINY, recompute=True)
    with pytest.raises(ValueError, match="family must be 'gpt'"):
        presets.get_preset("tiny").replace(family="rnn")


def test_config_dicts_round_trip_for_every_preset():
    for name, config in presets.ALL_PRESETS.items():
        assert models.config_from_dict(config.family, config.to_dict()) == config
        assert lm_config.flops_per_token(config) > 0 < config.non_embedding_parameter_count()


def test_a_family_declares_its_capabilities_in_its_one_entry():
    """The Llama family, everything but smp, is one ModelFamily entry; the rules every consumer reads
    follow from it: one rule, for smp, and the families with tgi named in rnn's rule."""
    assert lm_config.FAMILIES["llama"] == lm_config.ModelFamily(
        lm_config.LlamaConfig, "lm.models.llama:build_model",
        ("recompute", "kv_cache", "hf_export", "hf_import", "tgi", "lmi"), "llama")
    made = {found.name: found for found in job.family_rules()}
    assert [name for name in made if name.startswith("family.llama.")] == ["family.llama.smp"]
    assert made["family.llama.smp"].message.startswith("model llama cannot use strategy smp (capability smp: SMP v1")
    assert made["family.rnn.tgi"].message.endswith(having_message("tgi"))
    assert "family.llama.smp" in {found.name for found in job.job_rules()}


@pytest.mark.parametrize("capabilities,hf_model_type,problem", [
    (("kv_cache", "beam_search"), None, "unknown capabilities \\['beam_search'\\]"),
    (("hf_export",), None, "hf_model_type"),
    (("kv_cache",), "gpt2", "hf_model_type"),
    (("tgi", "hf_import"), "gpt2", "tgi serves the Hugging Face export, which needs hf_export"),
])
def test_an_inconsistent_declaration_is_refused(capabilities, hf_model_type, problem):
    with pytest.raises(ValueError, match=problem):
        lm_config.check_declaration("x", lm_config.ModelFamily(lm_config.GPTConfig, "m:f", capabilities,
                                                               hf_model_type))


def test_a_preset_implies_its_family_and_configuration_for_the_runtime():
    """lm.training.train given only --preset builds that preset of its family (lm.spec.families.with_preset);
    a model the preset is not of, or a preset that does not exist without a model_config, is refused."""
    from lm.training import train
    for preset, family in tiny_presets():
        hyperparameters, _ = train.parse_args(["--dry-run", "--preset", preset])
        assert hyperparameters.model == family
        assert hyperparameters.model_config == presets.get_preset(preset).to_dict()
    with pytest.raises(ValueError, match="hyperparameters.preset rnn-tiny is a preset of model rnn, not of "
                                         "hyperparameters.model gpt; its presets: tiny, gpt-125m"):
        train.parse_args(["--dry-run", "--preset", "rnn-tiny", "--model", "gpt"])
    with pytest.raises(ValueError, match="hyperparameters.preset 'gpt-9000' is not a preset and no "
                                         "hyperparameters.model_config is given; allowed: %s$" % ", ".join(presets.ALL_PRESETS)):
        train.parse_args(["--dry-run", "--preset", "gpt-9000"])
    # with a model_config the preset is only a label (a local run's own configuration)
    hyperparameters, _ = train.parse_args(["--dry-run", "--preset", "mine", "--model", "rnn",
                                           "--model_config", json.dumps(RNN_TINY.to_dict())])
    assert hyperparameters.model_config == RNN_TINY.to_dict()


def _family_module(name, family=None, presets=None):
    import types
    module = types.ModuleType("lm.spec.families." + name)
    if family is not None:
        module.FAMILY = family
    if presets is not None:
        module.PRESETS = presets
    return module


def test_a_family_module_that_declares_it_wrongly_is_refused_naming_the_module():
    """The registry's checks of what it finds (lm.spec.families._registry): each names the module and
    what it must declare, so a fork's mistake stops the import, not a job."""
    import collections
    from lm.spec.families import gpt
    registry = lm_config._registry
    with pytest.raises(ValueError, match=r"lm.spec.families.helpers is a family module .* it must declare FAMILY = "):
        registry([_family_module("helpers")])
    with pytest.raises(ValueError, match=r"lm.spec.families.gpt2 declares the family 'gpt': a family's config has "
                                         r"`family` = its module's name, 'gpt2'"):
        registry([_family_module("gpt2", gpt.FAMILY)])
    other = collections.OrderedDict([("rnn-like", RNN_TINY)])
    with pytest.raises(ValueError, match=r"lm.spec.families.gpt.PRESETS \['rnn-like'\] are not configs of family gpt"):
        registry([_family_module("gpt", gpt.FAMILY, other)])
    twice = _family_module("rnn", lm_config.FAMILIES["rnn"], collections.OrderedDict([("tiny", RNN_TINY)]))
    with pytest.raises(ValueError, match="preset tiny is declared by families gpt and rnn: preset names are unique"):
        registry([gpt, twice])
    families, family_presets, all_presets = registry([gpt])
    assert list(families) == ["gpt"] and family_presets["gpt"] is gpt.PRESETS and list(all_presets) == list(gpt.PRESETS)
