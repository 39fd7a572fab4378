"""Serve what `python -m lm.training.train` exported: sample corpus -> `lm.data.prepare` -> `lm.training.train` (tiny,
a few steps) -> the real server on 127.0.0.1."""
import json
import os
import subprocess
import sys

import pytest

from controlplane import presets
from serving import IMAGE, Server

TRAIN_HYPERPARAMETERS = {"preset": "tiny", "global_batch_size": 8, "max_steps": 10, "warmup_steps": 2,
                         "log_every": 5, "eval_every": 0, "eval_batches": 2, "checkpoint_every": 0, "xla": False}


def run(args, cwd):
    env = dict(os.environ, PYTHONPATH=IMAGE, TF_CPP_MIN_LOG_LEVEL="2")
    for name in list(env):
        if name.startswith("SM_"):
            del env[name]
    result = subprocess.run([sys.executable, "-m"] + args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=900)
    assert result.returncode == 0, result.stdout
    return result.stdout


@pytest.fixture(scope="module")
def trained_model_dir(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("trained"))
    run(["lmstack.sample_corpus", "raw/sample.jsonl.zst", "--max-bytes", "400000"], work)
    run(["lm.data.prepare", "raw", "--output", "data", "--train-tokenizer", "--vocab-size", "512", "--seq-len", "64",
         "--workers", "1", "--val-fraction", "0.1"], work)
    args = ["lm.training.train", "--data-dir", "data", "--checkpoint-dir", "checkpoints", "--export-dir", "model"]
    for name, value in presets.resolve(TRAIN_HYPERPARAMETERS).items():
        args += ["--" + name, json.dumps(value)]
    output = run(args, work)
    assert "[eval]" in output
    return os.path.join(work, "model")


@pytest.mark.slow
def test_serves_the_model_lm_train_exported(trained_model_dir, tmp_path):
    from lm.serving.export import load_exported
    from lm.serving.generate import Generator

    server = Server(trained_model_dir, str(tmp_path / "server.log"))
    try:
        server.wait_ready()
        request = {"inputs": ["The ", "def "], "parameters": {"temperature": 0, "max_new_tokens": 12}}
        response = server.invoke(request)
        assert response.status_code == 200, response.text
        served = [item["generated_text"] for item in response.json()]
    finally:
        server.stop()
    model, config, tokenizer = load_exported(trained_model_dir)
    assert config.family == "gpt" and config.block_size == 128
    assert served == Generator(model, config, tokenizer).generate(request["inputs"], **request["parameters"])
