"""The "prepare" SageMaker job, run locally by the real container toolkit (sagemaker-training).

The toolkit reads an /opt/ml-shaped tree (SAGEMAKER_BASE_DIR), turns the hyperparameters
lm.job encodes into `--name value` arguments and runs `prepare.py`, as in the training image.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from lm import job, request, sample_corpus, shards

IMAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "training_image")


def test_prepare_hyperparameters_validate_like_the_train_table():
    values = job.validate_hyperparameters({"seq_len": 128, "train_tokenizer": True}, job.PREPARE_HYPERPARAMETERS)
    assert values["seq_len"] == 128 and values["train_tokenizer"] is True and values["vocab_size"] == 50257
    with pytest.raises(ValueError, match="unknown hyperparameters preset"):
        job.validate_hyperparameters({"preset": "gpt-125m"}, job.PREPARE_HYPERPARAMETERS)


@pytest.mark.slow
def test_toolkit_runs_the_prepare_job_from_the_raw_channel_to_the_dataset_channel(tokenizer_file, tmp_path):
    base = tmp_path / "ml"
    code = base / "code"  # where the image bakes the code in
    shutil.copytree(os.path.join(IMAGE, "lm"), str(code / "lm"), ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(IMAGE, "prepare.py"), str(code / "prepare.py"))
    config = base / "input" / "config"
    config.mkdir(parents=True)
    raw = base / "input" / "data" / job.PREPARE_INPUT_CHANNEL
    dataset = base / "input" / "data" / job.PREPARE_OUTPUT_CHANNEL
    sample_corpus.write_sample_corpus(str(raw), max_bytes=60000, files=2)
    shutil.copy(tokenizer_file, str(raw / "tokenizer.json"))
    dataset.mkdir()
    hyperparameters = request.sdk_hyperparameters(
        {"tokenizer": "tokenizer.json", "train_tokenizer": False, "seq_len": 32, "shard_size": 4096,
         "val_fraction": 0.1, "workers": 1, "threads": 1},
        strategy="single", instance_type=job.PREPARE_INSTANCE_TYPE, processes_per_host=1, job_name="prepare-1",
        region="us-east-1", output_path="s3://bucket/output", job_kind="prepare")
    assert json.loads(hyperparameters["sagemaker_program"]) == "prepare.py"
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}))
    (config / "inputdataconfig.json").write_text(json.dumps(
        {job.PREPARE_INPUT_CHANNEL: {"TrainingInputMode": "FastFile"},
         job.PREPARE_OUTPUT_CHANNEL: {"TrainingInputMode": "File"}}))
    env = dict(os.environ, SAGEMAKER_BASE_DIR=str(base), SAGEMAKER_PROGRAM="prepare.py",
               SAGEMAKER_SUBMIT_DIRECTORY=str(code), SM_STUDIO_LOCAL_MODE="true")
    result = subprocess.run([sys.executable, "-m", "sagemaker_training.cli.train"], env=env, cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0 and "Reporting training SUCCESS" in result.stdout, result.stdout[-4000:]
    assert "--train_tokenizer False" in result.stdout  # the toolkit's spelling of a boolean
    manifest = shards.load_manifest(str(dataset))
    assert shards.verify(str(dataset), manifest) == []
    assert manifest.prepare["complete"] and sorted(manifest.inputs) == ["00", "01"]
    assert manifest.seq_len == 32 and manifest.tokenizer_sha256 == shards.sha256_file(tokenizer_file)
