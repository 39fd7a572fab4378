"""Serve what `lm.training.train` exported: sample corpus -> `lm.data.prepare` -> `lm.training.train` (the tiny
preset of each transformer family, a few steps; its command line's main in this process, where TensorFlow is loaded
already) -> the real server on 127.0.0.1."""
import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from controlplane import presets
from family_cases import tiny_presets
from lm.training import train
from serving import IMAGE, ROOT, Server

TRAIN_HYPERPARAMETERS = {"preset": "tiny", "global_batch_size": 8, "max_steps": 10, "warmup_steps": 2,
                         "log_every": 5, "eval_every": 0, "eval_batches": 2, "checkpoint_every": 0, "xla": False}


def run(args, cwd):
    # the image's packages, and the repository root for lmstack.sample_corpus (not in the image)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([IMAGE, ROOT]), TF_CPP_MIN_LOG_LEVEL="2")
    for name in list(env):
        if name.startswith("SM_"):
            del env[name]
    result = subprocess.run([sys.executable, "-m"] + args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=900)
    assert result.returncode == 0, result.stdout


# Every family whose Hugging Face export the tests below serve and compare (tests/family_cases.py).
@pytest.fixture(scope="module", params=tiny_presets("hf_export"), ids=lambda case: case[1])
def trained_model_dir(tmp_path_factory, request):
    preset, family = request.param
    work = str(tmp_path_factory.mktemp("trained"))
    run(["lmstack.sample_corpus", "raw/sample.jsonl.zst", "--max-bytes", "400000"], work)
    run(["lm.data.prepare", "raw", "--output", "data", "--train-tokenizer", "--vocab-size", "512", "--seq-len", "64",
         "--workers", "1", "--val-fraction", "0.1"], work)
    args = ["--data-dir", os.path.join(work, "data"), "--checkpoint-dir", os.path.join(work, "checkpoints"),
            "--export-dir", os.path.join(work, "model")]
    hyperparameters = dict(TRAIN_HYPERPARAMETERS, preset=preset, model=family, export_hf=True)
    for name, value in presets.resolve(hyperparameters).items():
        args += ["--" + name, json.dumps(value)]
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert train.main(args) == 0
    assert "[eval]" in output.getvalue()
    return os.path.join(work, "model"), family


@pytest.mark.slow
def test_serves_the_model_lm_train_exported(trained_model_dir, tmp_path):
    from lm.serving.export import load_exported
    from lm.serving.generate import Generator

    trained_model_dir, family = trained_model_dir
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
    assert config.family == family and config.block_size == 128
    with open(os.path.join(trained_model_dir, "config.json")) as f:  # export_hf: what TGI and LMI serve
        assert json.load(f)["model_type"] == {"gpt": "gpt2", "llama": "llama"}[family]
    assert served == Generator(model, config, tokenizer).generate(request["inputs"], **request["parameters"])
