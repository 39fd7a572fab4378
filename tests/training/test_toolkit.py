"""The entrypoint run by the REAL sagemaker-training toolkit against a local /opt/ml tree.

The hyperparameters file is exactly what `controlplane.request.sdk_hyperparameters` produces for the state
machine's CreateTrainingJob request; the toolkit decodes it and runs `train.py` from
/opt/ml/code as SageMaker runs our image.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from controlplane import metrics as log_metrics
from lm.spec import contract
from controlplane import presets, request

from . import helpers
from checkpoint_listing import checkpoint_files


def opt_ml_tree(root, dataset, hyperparameters):
    config = os.path.join(root, "input", "config")
    os.makedirs(config)
    encoded = request.sdk_hyperparameters(
        hyperparameters, strategy="single", instance_type="ml.m5.xlarge", processes_per_host=1,
        job_name="lmstack-test-1", region="us-east-1", output_path="s3://example-bucket/jobs")
    with open(os.path.join(config, "hyperparameters.json"), "w") as handle:
        json.dump(encoded, handle)
    with open(os.path.join(config, "resourceconfig.json"), "w") as handle:
        json.dump({"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"}, handle)
    with open(os.path.join(config, "inputdataconfig.json"), "w") as handle:
        json.dump({contract.TRAIN_CHANNEL: {"TrainingInputMode": "File"}}, handle)
    shutil.copytree(dataset, os.path.join(root, "input", "data", contract.TRAIN_CHANNEL))
    # As the Dockerfile bakes it in: the code at /opt/ml/code, which is where the toolkit
    # looks when the hyperparameters carry no sagemaker_submit_directory.
    code = os.path.join(root, "code")
    shutil.copytree(os.path.join(helpers.TRAINING_IMAGE, "lm"), os.path.join(code, "lm"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(helpers.TRAINING_IMAGE, "train.py"), code)
    return encoded


def run_toolkit(root):
    env = helpers.environment(SAGEMAKER_BASE_DIR=root, SAGEMAKER_PROGRAM="train.py",
                              SAGEMAKER_SUBMIT_DIRECTORY=os.path.join(root, "code"), SM_STUDIO_LOCAL_MODE="true")
    del env["PYTHONPATH"]  # the toolkit must find `lm` next to train.py, as in the image
    return subprocess.run([sys.executable, "-m", "sagemaker_training.cli.train"], env=env, cwd=root,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)


@pytest.mark.slow
def test_toolkit_runs_train_py_and_the_model_is_written(text_dataset, tmp_path):
    root = str(tmp_path / "opt_ml")
    hyperparameters = presets.resolve(dict(helpers.TINY, max_steps=4, log_every=2, scale_lr=False, xla=False))
    encoded = opt_ml_tree(root, text_dataset, hyperparameters)
    assert encoded["scale_lr"] == "false" and encoded["preset"] == '"tiny"'
    result = run_toolkit(root)
    assert result.returncode == 0, result.stdout
    assert os.path.isfile(os.path.join(root, "model", "model.json")), result.stdout
    assert "Reporting training SUCCESS" in result.stdout
    assert checkpoint_files(os.path.join(root, "checkpoints")) == ["ckpt-00000004.npz"]
    metrics = [log_metrics.parse_metrics(line) for line in result.stdout.splitlines()]
    assert [m["train:loss"] for m in metrics if "train:loss" in m]
    final = [m["validation:loss"] for m in metrics if "validation:loss" in m]
    assert len(final) == 1 and final[0] > 0
    # scale_lr=false arrived as a boolean: the logged rate is the unscaled schedule's.
    assert "lr=4.167e-04" in result.stdout


@pytest.mark.slow
def test_toolkit_bad_hyperparameter_fails_with_a_readable_failure_file(text_dataset, tmp_path):
    root = str(tmp_path / "opt_ml")
    opt_ml_tree(root, text_dataset, dict(helpers.TINY, precision="fp64"))
    result = run_toolkit(root)
    assert result.returncode != 0
    with open(os.path.join(root, "output", "failure")) as handle:
        failure = handle.read()
    assert failure.strip() == "hyperparameters.precision must be one of auto, fp32, fp16, bf16, got 'fp64'"
    assert not os.path.exists(os.path.join(root, "model", "model.json"))
