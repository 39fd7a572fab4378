"""The "prepare" SageMaker job, run locally by the real container toolkit (sagemaker-training).

The toolkit reads an /opt/ml-shaped tree (SAGEMAKER_BASE_DIR), turns the hyperparameters
controlplane.request encodes into `--name value` arguments and runs `prepare.py`, as in the training image.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from controlplane import inputs
from lm.spec import job
from controlplane import request
from lmstack import sample_corpus
from stacks.state_machine import training
from lm.spec import shards

IMAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "training_image")


def test_prepare_hyperparameters_validate_like_the_train_table():
    values = job.validate_hyperparameters({"seq_len": 128, "train_tokenizer": True}, job.PREPARE_HYPERPARAMETERS)
    assert values["seq_len"] == 128 and values["train_tokenizer"] is True and values["vocab_size"] == 50257
    with pytest.raises(ValueError, match="unknown hyperparameters preset"):
        job.validate_hyperparameters({"preset": "gpt-125m"}, job.PREPARE_HYPERPARAMETERS)


def _run_toolkit_job(tmp_path, values, raw_files=()):
    """Run the prepare job through the toolkit as SageMaker would, with lm.data.prepare's own `values` (the
    builder adds the dataset directory /datasets/pile for an EFS raw channel) and `raw_files` copied into
    the raw channel next to the sample corpus. Returns (toolkit result, dataset directory, file system root)."""
    base = tmp_path / "ml"
    code = base / "code"  # where the image bakes the code in
    shutil.copytree(os.path.join(IMAGE, "lm"), str(code / "lm"), ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(IMAGE, "prepare.py"), str(code / "prepare.py"))
    config = base / "input" / "config"
    config.mkdir(parents=True)
    raw = base / "input" / "data" / job.PREPARE_INPUT_CHANNEL
    root = base / "input" / "data" / job.PREPARE_OUTPUT_CHANNEL  # the file system's root, mounted rw
    sample_corpus.write_sample_corpus(str(raw), max_bytes=60000, files=2)
    for path in raw_files:
        shutil.copy(path, str(raw / os.path.basename(path)))
    root.mkdir()
    values = dict(values, **request.prepare_arguments(_prepare_job("/datasets/pile", raw_s3_uri=None)))
    hyperparameters = request.sdk_hyperparameters(
        values,
        strategy="single", instance_type=inputs.PREPARE_INSTANCE_TYPE, processes_per_host=1, job_name="prepare-1",
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
    return result, root / "datasets" / "pile", root


def test_every_prepare_hyperparameter_is_in_the_dataset_key_or_changes_only_the_speed():
    """A new lm.data.prepare setting must say whether it changes the shards: then it belongs in the state
    machine's dataset key (stacks.state_machine.training), or a new setting would reuse an old dataset."""
    speed = {"workers", "threads", "shard_index", "num_shards"}  # how the work is split, not its result
    assert set(job.PREPARE_HYPERPARAMETERS) - set(training.PREPARE_OUTPUT_HYPERPARAMETERS) == speed
    assert set(training.PREPARE_OUTPUT_HYPERPARAMETERS) <= set(job.PREPARE_HYPERPARAMETERS)


@pytest.mark.slow
def test_toolkit_runs_the_prepare_job_from_the_raw_channel_to_the_dataset_channel(tokenizer_file, tmp_path):
    values = {"tokenizer": "tokenizer.json", "train_tokenizer": False, "seq_len": 32, "shard_size": 4096,
              "val_fraction": 0.1, "workers": 1, "threads": 1}
    result, dataset, root = _run_toolkit_job(tmp_path, values, [tokenizer_file])
    assert result.returncode == 0 and "Reporting training SUCCESS" in result.stdout, result.stdout[-4000:]
    assert "--train_tokenizer False" in result.stdout  # the toolkit's spelling of a boolean
    manifest = shards.load_manifest(str(dataset))
    assert shards.verify(str(dataset), manifest) == []
    assert manifest.prepare["complete"] and sorted(manifest.inputs) == ["00", "01"]
    assert manifest.seq_len == 32 and manifest.tokenizer_sha256 == shards.sha256_file(tokenizer_file)
    assert sorted(os.listdir(str(root))) == ["datasets"]


@pytest.mark.slow
def test_the_prepare_job_with_its_default_hyperparameters_trains_a_tokenizer(tmp_path):
    """Issue 24.5: what `python -m lmstack.start --upload-corpus DIR` sends (every prepare hyperparameter
    at its default: no tokenizer, train_tokenizer false, no init channel) was refused by lm.data.prepare, after
    the instance was provisioned. It now trains a byte-level BPE on the corpus."""
    defaults = job.validate_hyperparameters({}, job.PREPARE_HYPERPARAMETERS)
    result, dataset, _ = _run_toolkit_job(tmp_path, defaults)
    assert result.returncode == 0 and "Reporting training SUCCESS" in result.stdout, result.stdout[-4000:]
    assert "training a byte-level BPE tokenizer (vocab 50257)" in result.stdout
    manifest = shards.load_manifest(str(dataset))
    assert shards.verify(str(dataset), manifest) == [] and manifest.prepare["complete"]
    assert manifest.prepare["trained_vocab_size"] == 50257 and manifest.seq_len == 2048
    assert manifest.tokenizer_sha256 == shards.sha256_file(str(dataset / manifest.tokenizer_file))


def _prepare_job(data_directory, raw_s3_uri):
    return request.TrainingJob(
        kind="prepare", name="prepare-1", image="image", role_arn="role", bucket="bucket", region="us-east-1",
        hyperparameters={}, instance_type=inputs.PREPARE_INSTANCE_TYPE, instance_count=2, max_runtime_seconds=3600,
        spot=False, file_system_id="fs-0123456789abcdef0", security_group_ids=["sg-1"], subnets=["subnet-1"],
        data_directory=data_directory, execution_name="run-1", raw_directory="/raw", raw_s3_uri=raw_s3_uri)


def test_the_prepare_request_mounts_the_root_and_reads_s3_sharded():
    sent = request.create_training_job_request(_prepare_job("/datasets/pile", "s3://bucket/raw/pile/"))
    raw, dataset = sent["InputDataConfig"]
    assert raw["InputMode"] == "FastFile"
    assert raw["DataSource"]["S3DataSource"] == {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/raw/pile/",
                                                 "S3DataDistributionType": "ShardedByS3Key"}
    assert dataset["DataSource"]["FileSystemDataSource"]["DirectoryPath"] == "/"
    assert dataset["DataSource"]["FileSystemDataSource"]["FileSystemAccessMode"] == "rw"
    assert json.loads(sent["HyperParameters"]["dataset_directory"]) == "/datasets/pile"
    assert json.loads(sent["HyperParameters"]["raw_sharded"]) is True
    efs = request.create_training_job_request(_prepare_job("/datasets/pile", None))
    assert efs["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]["DirectoryPath"] == "/raw"
    assert json.loads(efs["HyperParameters"]["raw_sharded"]) is False
    assert {"Key": request.DATASET_DIRECTORY_TAG, "Value": "/datasets/pile"} in efs["Tags"]


def test_sharded_raw_input_takes_every_file_and_the_merge_counts_all_parts(tokenizer_file, tmp_path):
    """Two instances, each with its own share of the files (as ShardedByS3Key hands them out): each part
    takes all it sees; the last one merges a manifest of every input."""
    from lm.data import prepare
    root = tmp_path / "root"
    root.mkdir()
    shares = []
    for index in range(2):
        share = tmp_path / ("share-%d" % index)
        sample_corpus.write_sample_corpus(str(share), max_bytes=30000, files=1)
        os.rename(str(share / os.listdir(str(share))[0]), str(share / ("part-%d.jsonl.zst" % index)))
        shares.append(share)
    for index, share in enumerate(shares):
        code = prepare.main([str(share), "--tokenizer", tokenizer_file, "--seq-len", "32", "--workers", "1",
                             "--shard-index", str(index), "--num-shards", "2", "--raw-sharded", "true",
                             "--output", str(root / "datasets" / "pile")])
        assert code == 0
    manifest = shards.load_manifest(str(root / "datasets" / "pile"))
    assert sorted(manifest.inputs) == ["part-0", "part-1"] and manifest.prepare["complete"]
    # Without --raw-sharded the second instance takes every 2nd file of the one it sees: part-1 is lost.
    lost = tmp_path / "lost"
    for index, share in enumerate(shares):
        assert prepare.main([str(share), "--tokenizer", tokenizer_file, "--seq-len", "32", "--workers", "1",
                             "--shard-index", str(index), "--num-shards", "2", "--output", str(lost)]) == 0
    assert sorted(shards.load_manifest(str(lost)).inputs) == ["part-0"]
    assert prepare.output_directory(str(root), "/datasets/pile") == str(root / "datasets" / "pile")
    assert prepare.output_directory(None, "/datasets/pile") is None


def test_a_tokenizer_among_sharded_raw_files_is_refused_and_one_on_the_file_system_is_found(tokenizer_file, tmp_path,
                                                                                           monkeypatch, capsys):
    from lm.data import prepare
    share = tmp_path / "share"
    sample_corpus.write_sample_corpus(str(share), max_bytes=20000, files=1)
    shutil.copy(tokenizer_file, str(share / "tokenizer.json"))
    root = tmp_path / "root"
    (root / "tokenizers").mkdir(parents=True)
    shutil.copy(tokenizer_file, str(root / "tokenizers" / "bpe.json"))
    common = [str(share), "--seq-len", "32", "--workers", "1", "--shard-index", "0", "--num-shards", "2",
              "--raw-sharded", "true"]
    monkeypatch.setenv("SM_CHANNEL_" + job.PREPARE_OUTPUT_CHANNEL.upper(), str(root))
    assert prepare.main(common + ["--tokenizer", "tokenizer.json", "--dataset-directory", "/datasets/a"]) == 2
    assert "reaches one instance" in capsys.readouterr().err
    assert prepare.main(common + ["--tokenizer", "/tokenizers/bpe.json", "--dataset-directory", "/datasets/a"]) == 0
    part = json.loads((root / "datasets" / "a" / "manifest-part-00000-of-00002.json").read_text())
    assert part["tokenizer_sha256"] == shards.sha256_file(tokenizer_file)
