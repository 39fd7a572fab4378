"""Smoke test on current TensorFlow (>= 2.16, Keras 2 through tf_keras), in `.venv-tfcurrent`:
the sample corpus is prepared into tiny shards, `python -m lm.training.train` trains `tiny` a few
single-device steps, exports, and the export is reloaded and run. The main test environment
runs TF 2.15; together they measure the claim that one code base runs on both sides of the
Keras 3 switch."""
import json
import os
import subprocess

import pytest

from controlplane import base_images
from controlplane import presets
from checkpoint_listing import checkpoint_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.path.join(ROOT, ".venv-tfcurrent", "bin", "python")
STEPS = 6

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.access(PYTHON, os.X_OK),
                       reason=".venv-tfcurrent is missing: build it with `make .venv-tfcurrent/.installed` "
                              "(`make test` does)"),
]

RELOAD = """
import json, sys
import numpy as np
from lm.compat import TF_VERSION, keras, tf
from lm.serving.export import load_exported
model, config, tokenizer = load_exported(sys.argv[1])
ids = tokenizer.encode("The quick brown fox jumps over the lazy dog.").ids[:16]
logits = model(tf.constant([ids], tf.int32)).numpy()
print(json.dumps({"tf": tf.__version__, "tf_version": list(TF_VERSION), "keras": keras.__name__,
                  "keras_version": keras.__version__, "shape": list(logits.shape),
                  "finite": bool(np.isfinite(logits).all()), "tokens": len(ids),
                  "vocab": config.padded_vocab_size}))
"""


def _run(args, **kwargs):
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("SM_") and name not in ("TF_CONFIG", "LM_CHECKPOINT_DIR", "PYTHONHOME")}
    env.update(PYTHONPATH=os.path.join(ROOT, "training_image"), TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1",
               TF_NUM_INTRAOP_THREADS="2", TF_NUM_INTEROP_THREADS="1")
    result = subprocess.run([PYTHON] + args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=600, **kwargs)
    assert result.returncode == 0, "%s failed:\n%s" % (" ".join(args[:3]), result.stdout[-4000:])
    return result.stdout


def test_prepare_train_export_reload_on_current_tf(tmp_path):
    corpus, data, out = str(tmp_path / "raw.jsonl"), str(tmp_path / "data"), str(tmp_path / "run")
    _run(["-m", "lmstack.sample_corpus", corpus, "--max-bytes", "400000"])
    _run(["-m", "lm.data.prepare", corpus, "--output", data, "--train-tokenizer", "--vocab-size", "512",
          "--seq-len", "64", "--val-fraction", "0.05", "--workers", "1", "--threads", "1"])
    output = _run(["-m", "lm.training.train", "--data-dir", data, "--checkpoint-dir", os.path.join(out, "ckpt"),
                   "--export-dir", os.path.join(out, "model"), "--strategy", "single", *presets.train_arguments("tiny"),
                   "--global_batch_size", "8", "--max_steps", str(STEPS), "--warmup_steps", "2",
                   "--learning_rate", "0.000625", "--log_every", "1", "--eval_every", "0", "--eval_batches", "1",
                   "--checkpoint_every", "3", "--seed", "7"])
    logged = [line for line in output.splitlines() if line.startswith("[train] step=")]
    assert [int(line.split("step=")[1].split()[0]) for line in logged] == list(range(1, STEPS + 1)), output
    assert checkpoint_files(os.path.join(out, "ckpt")) == ["ckpt-%08d.npz" % 3, "ckpt-%08d.npz" % STEPS]

    facts = json.loads(_run(["-c", RELOAD, os.path.join(out, "model")]).strip().splitlines()[-1])
    assert tuple(facts["tf_version"]) >= (2, 16), facts
    # The environment runs the TensorFlow of the image `tfcurrent` builds on, and the tf_keras of
    # the same minor version that training_image/Dockerfile installs there.
    image_tf = base_images.RUNTIMES["tfcurrent"].split("-")[0]
    assert facts["tf"] == image_tf and facts["keras_version"].startswith(image_tf.rsplit(".", 1)[0] + "."), facts
    assert facts["keras"] == "tf_keras" and facts["keras_version"].startswith("2."), facts
    assert facts["shape"] == [1, facts["tokens"], facts["vocab"]] and facts["finite"], facts
