import json
import os
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer

from lm.serving import export as lm_export
from lm import models
from lm.compat import keras, tf
from controlplane.presets import get_preset
from lm.tokenizer import save, train_bpe


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    save(train_bpe(["a small corpus for a small tokenizer %d" % i for i in range(50)], vocab_size=300), path)
    return path


def logits(model):
    return model(tf.constant([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])).numpy()


@pytest.mark.parametrize("preset, changes", [
    ("tiny", {}), ("tiny", {"norm": "post", "activation": "relu", "tie_embeddings": False}),
    ("rnn-tiny", {}), ("rnn-tiny", {"cell": "lstm"}),
], ids=["gpt", "gpt-seed-style-untied", "rnn-gru", "rnn-lstm"])
def test_round_trip_gives_identical_logits(tmp_path, tokenizer_file, preset, changes):
    keras.utils.set_random_seed(5)
    config = get_preset(preset).replace(**changes)
    model = models.build(config)
    out = str(tmp_path / "model")
    assert lm_export.export_model(model, config, tokenizer_file, out) == out
    assert sorted(os.listdir(out)) == ["model.json", "tokenizer.json", "weights.npz"]
    keras.utils.set_random_seed(99)  # a fresh build gets other weights: loading must overwrite all
    loaded, loaded_config, tokenizer = lm_export.load_exported(out)
    assert loaded_config == config and type(loaded) is type(model)
    np.testing.assert_array_equal(logits(loaded), logits(model))
    assert isinstance(tokenizer, Tokenizer)
    assert tokenizer.to_str() == Tokenizer.from_file(tokenizer_file).to_str()
    with open(os.path.join(out, "model.json")) as f:
        description = json.load(f)
    assert description["family"] == config.family and description["params"] == model.count_params()


def test_export_into_an_existing_model_dir_replaces_the_old_export(tmp_path, tokenizer_file):
    out = str(tmp_path / "model")
    os.makedirs(out)  # SM_MODEL_DIR exists before training starts
    first = models.build(get_preset("tiny"))
    lm_export.export_model(first, get_preset("tiny"), tokenizer_file, out)
    config = get_preset("rnn-tiny")
    second = models.build(config)
    lm_export.export_model(second, config, tokenizer_file, out)
    loaded, loaded_config, _ = lm_export.load_exported(out)
    assert loaded_config == config
    np.testing.assert_array_equal(logits(loaded), logits(second))
    assert sorted(os.listdir(out)) == ["model.json", "tokenizer.json", "weights.npz"]


def test_a_failed_export_leaves_the_previous_one_intact(tmp_path, tokenizer_file, monkeypatch):
    out = str(tmp_path / "model")
    config = get_preset("tiny")
    model = models.build(config)
    lm_export.export_model(model, config, tokenizer_file, out)

    def broken_copy(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(shutil, "copyfile", broken_copy)
    with pytest.raises(OSError, match="disk full"):
        lm_export.export_model(models.build(config), config, tokenizer_file, out)
    assert sorted(os.listdir(out)) == ["model.json", "tokenizer.json", "weights.npz"]
    np.testing.assert_array_equal(logits(lm_export.load_exported(out)[0]), logits(model))


def test_a_half_written_export_is_not_loaded(tmp_path, tokenizer_file):
    out = str(tmp_path / "model")
    config = get_preset("tiny")
    lm_export.export_model(models.build(config), config, tokenizer_file, out)
    os.remove(os.path.join(out, "model.json"))
    with pytest.raises(lm_export.ExportError, match="model.json: not found"):
        lm_export.load_exported(out)


def test_weights_that_do_not_fit_the_config_are_a_clear_error(tmp_path, tokenizer_file):
    out = str(tmp_path / "model")
    config = get_preset("tiny")
    lm_export.export_model(models.build(config), config, tokenizer_file, out)
    path = os.path.join(out, "model.json")
    with open(path) as f:
        description = json.load(f)
    description["config"]["d_model"] = 32
    with open(path, "w") as f:
        json.dump(description, f)
    with pytest.raises(lm_export.ExportError, match="weights.npz"):
        lm_export.load_exported(out)
    description["family"] = "transformer-xl"
    with open(path, "w") as f:
        json.dump(description, f)
    with pytest.raises(lm_export.ExportError, match="allowed: %s$" % ", ".join(models.FAMILIES)):
        lm_export.load_exported(out)


def test_export_refuses_a_model_that_does_not_match_its_config(tmp_path, tokenizer_file):
    model = models.build(get_preset("tiny"))
    with pytest.raises(ValueError, match="parameters"):
        lm_export.export_model(model, get_preset("tiny").replace(n_layer=3), tokenizer_file, str(tmp_path / "m"))
    with pytest.raises(ValueError, match="tokenizer_file"):
        lm_export.export_model(model, get_preset("tiny"), str(tmp_path / "missing.json"), str(tmp_path / "m"))
    assert not os.path.exists(str(tmp_path / "m" / "model.json"))
