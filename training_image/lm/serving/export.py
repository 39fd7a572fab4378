"""The exported model: what `lm.training.train` writes to SM_MODEL_DIR and `lm.serving.server` loads.

    model.json      family, config, weight names and shapes (written last: its presence
                    means the export is complete)
    weights.npz     the weights as float32 arrays, in `model.get_weights()` order
    tokenizer.json  the tokenizers file the model was trained with

NumPy arrays load the same on every TF/Keras version we run (2.6 .. current), unlike
Keras' own weight formats, and the model is rebuilt from its config by `lm.models`.
"""
import json
import os
import shutil
import tempfile

import numpy as np
from tokenizers import Tokenizer

from lm import models

CONFIG_FILE = "model.json"
WEIGHTS_FILE = "weights.npz"
TOKENIZER_FILE = "tokenizer.json"
FORMAT_VERSION = 1


class ExportError(ValueError):
    """An export directory that cannot be loaded; names the file and the problem."""


def export_model(model, config, tokenizer_file, out_dir):
    """Write the model to `out_dir` (created if missing; SM_MODEL_DIR already exists).

    Every file is written in a temporary directory inside `out_dir` and renamed into place,
    model.json last and after removing an old one, so a reader never sees a half export.
    """
    expected = models.parameter_count(config)
    if model.count_params() != expected:
        raise ValueError("model has %d parameters but config %s describes %d" % (
            model.count_params(), config, expected))
    if not os.path.isfile(tokenizer_file):
        raise ValueError("tokenizer_file %s: not found" % tokenizer_file)
    os.makedirs(out_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".export-", dir=out_dir)
    try:
        weights = [np.asarray(w, np.float32) for w in model.get_weights()]
        np.savez(os.path.join(staging, WEIGHTS_FILE), *weights)
        shutil.copyfile(tokenizer_file, os.path.join(staging, TOKENIZER_FILE))
        description = {
            "format_version": FORMAT_VERSION,
            "family": config.family,
            "config": config.to_dict(),
            "params": expected,
            "weights": [{"name": w.name, "shape": list(w.shape)} for w in model.weights],
        }
        with open(os.path.join(staging, CONFIG_FILE), "w") as f:
            json.dump(description, f, indent=2)
        final_config = os.path.join(out_dir, CONFIG_FILE)
        if os.path.exists(final_config):
            os.remove(final_config)
        for name in (WEIGHTS_FILE, TOKENIZER_FILE, CONFIG_FILE):
            os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _read_description(model_dir):
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ExportError("%s: not found; %s holds no complete export" % (path, model_dir))
    try:
        with open(path) as f:
            description = json.load(f)
    except ValueError as error:
        raise ExportError("%s: not JSON: %s" % (path, error))
    if description.get("format_version") != FORMAT_VERSION:
        raise ExportError("%s: format_version %r, this code reads %d" % (
            path, description.get("format_version"), FORMAT_VERSION))
    try:
        config = models.config_from_dict(description.get("family"), description.get("config") or {})
    except ValueError as error:
        raise ExportError("%s: %s" % (path, error))
    return config


def load_exported(model_dir):
    """(model, config, tokenizer) from a directory written by `export_model`."""
    config = _read_description(model_dir)
    weights_path = os.path.join(model_dir, WEIGHTS_FILE)
    try:
        with np.load(weights_path) as archive:
            weights = [archive["arr_%d" % i] for i in range(len(archive.files))]
    except (OSError, ValueError, KeyError) as error:
        raise ExportError("%s: cannot read weights: %s" % (weights_path, error))
    model = models.build(config)
    shapes = [tuple(w.shape) for w in model.weights]
    if [tuple(w.shape) for w in weights] != shapes:
        raise ExportError("%s: %d arrays do not match the %d weights of the %s model built from %s" % (
            weights_path, len(weights), len(shapes), config.family, CONFIG_FILE))
    model.set_weights(weights)
    tokenizer_path = os.path.join(model_dir, TOKENIZER_FILE)
    try:
        tokenizer = Tokenizer.from_file(tokenizer_path)
    except Exception as error:  # tokenizers raises a bare Exception for a missing or bad file
        raise ExportError("%s: cannot load the tokenizer: %s" % (tokenizer_path, error))
    return model, config, tokenizer
