"""lm.data.prepare with a Hugging Face GPT-2 checkpoint (init_from, issue 17.3): the prepare job gets the
`init` channel and tokenizes with the checkpoint's tokenizer.json, so lm.training.train --init-from accepts
the dataset it makes.

The checkpoints here are written by lm.hf (our writer of the format transformers loads, checked
against transformers itself in tests/hf), with a byte-level BPE trained by `tokenizers` in the test
and an end-of-document token that is not our default one: config.json's eos_token_id decides it.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from controlplane import bucket_layout
from controlplane import inputs
from controlplane import presets
from lm.spec import contract
from lm.spec import job
from lm.data import prepare
from controlplane import request
from lmstack import sample_corpus
from lm.spec import shards
from lm import hf
from lm import tokenizer as tokenizers_lib

IMAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "training_image")
EOS_TOKEN = "</s>"  # the checkpoint's eos (config.json eos_token_id), not lm.data.prepare's default <|endoftext|>
INIT_FROM = "s3://lmstack-artifacts/%sgpt2-small-vocab/" % bucket_layout.INIT_PREFIX
SEQ_LEN = 32


def _checkpoint_tokenizer(path):
    texts = [doc["text"] for doc in sample_corpus.sample_documents(60000, seed=3)]
    tokenizer = tokenizers_lib.train_bpe(texts, vocab_size=299)
    tokenizer.add_special_tokens([EOS_TOKEN])
    tokenizers_lib.save(tokenizer, path)
    return tokenizer


def _set_config(hf_dir, **values):
    path = os.path.join(hf_dir, hf.HF_CONFIG_FILE)
    with open(path) as f:
        config = json.load(f)
    config.update(values)
    with open(path, "w") as f:
        json.dump(config, f)


def _model_config(vocab_size):
    from controlplane.presets import get_preset
    return get_preset("tiny").replace(vocab_size=vocab_size, pad_vocab_to=1)


@pytest.fixture(scope="module")
def tokenizer_checkpoint(tmp_path_factory):
    """A GPT-2 directory with config.json and tokenizer.json only: all lm.data.prepare reads of it."""
    hf_dir = str(tmp_path_factory.mktemp("tokenizer-checkpoint"))
    tokenizer = _checkpoint_tokenizer(os.path.join(hf_dir, "tokenizer.json"))
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    with open(os.path.join(hf_dir, hf.HF_CONFIG_FILE), "w") as f:
        json.dump(hf.gpt2.gpt2_config(_model_config(tokenizer.get_vocab_size()), eos_id), f)
    return hf_dir, eos_id


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A whole GPT-2 directory (random tiny weights), as lm.training.train --init-from reads it."""
    from lm import models

    root = tmp_path_factory.mktemp("checkpoint")
    tokenizer_file = str(root / "bpe.json")
    tokenizer = _checkpoint_tokenizer(tokenizer_file)
    config = _model_config(tokenizer.get_vocab_size())
    hf_dir = hf.write_hf(models.build(config), config, tokenizer_file, str(root / "gpt2"))
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    _set_config(hf_dir, eos_token_id=eos_id)
    return hf_dir, eos_id


def _prepare(raw, output, *extra):
    return prepare.main([raw, "--output", output, "--seq-len", str(SEQ_LEN), "--workers", "1", "--threads", "1",
                         "--val-fraction", "0"] + list(extra))


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("raw"))
    sample_corpus.write_sample_corpus(directory, max_bytes=40000, files=1)
    return directory


def test_the_init_channel_variable_makes_lm_prepare_tokenize_with_the_checkpoints_tokenizer(
        tokenizer_checkpoint, raw, tmp_path, monkeypatch):
    hf_dir, eos_id = tokenizer_checkpoint
    monkeypatch.setenv(contract.channel_environment_variable(contract.INIT_CHANNEL), hf_dir)
    output = str(tmp_path / "dataset")
    assert _prepare(raw, output) == 0
    manifest = shards.load_manifest(output)
    checkpoint_tokenizer = os.path.join(hf_dir, "tokenizer.json")
    assert manifest.tokenizer_sha256 == shards.sha256_file(checkpoint_tokenizer)
    assert shards.sha256_file(os.path.join(output, manifest.tokenizer_file)) == manifest.tokenizer_sha256
    assert manifest.eod_token_id == eos_id != 0  # config.json's eos, not the BPE's <|endoftext|> (id 0)
    # The same run spelled out with --tokenizer and --eod-token: the same bytes (one code path).
    monkeypatch.delenv(contract.channel_environment_variable(contract.INIT_CHANNEL))
    spelled = str(tmp_path / "spelled")
    assert _prepare(raw, spelled, "--tokenizer", checkpoint_tokenizer, "--eod-token", EOS_TOKEN) == 0
    with open(shards.manifest_path(output)) as ours, open(shards.manifest_path(spelled)) as theirs:
        assert json.load(ours)["shards"] == json.load(theirs)["shards"]


@pytest.mark.parametrize("extra, message", [
    (["--train-tokenizer"], "brings the checkpoint's tokenizer; --train-tokenizer would train another: leave it out"),
    (["--tokenizer", "other.json"], "brings the checkpoint's tokenizer; --tokenizer other.json would tokenize with "
                                    "another: leave it out"),
    (["--eod-token", "<pad>"], "--eod-token '<pad>': the checkpoint's end-of-document token (config.json "
                               "eos_token_id) is '</s>'; leave --eod-token out"),
])
def test_a_tokenizer_of_its_own_next_to_the_checkpoint_is_refused(tokenizer_checkpoint, raw, tmp_path, capsys,
                                                                   extra, message):
    hf_dir, _ = tokenizer_checkpoint
    assert _prepare(raw, str(tmp_path / "dataset"), "--init-from", hf_dir, *extra) == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(str(tmp_path / "dataset"))


def test_a_checkpoint_whose_vocabulary_the_tokenizer_overflows_is_refused(tokenizer_checkpoint, raw, tmp_path,
                                                                          capsys):
    hf_dir = str(tmp_path / "gpt2")
    shutil.copytree(tokenizer_checkpoint[0], hf_dir)
    _set_config(hf_dir, vocab_size=100)
    assert _prepare(raw, str(tmp_path / "dataset"), "--init-from", hf_dir) == 2
    assert "tokenizer.json has 300 tokens, more than the vocab_size 100 of %s" % os.path.join(
        hf_dir, "config.json") in capsys.readouterr().err
    _set_config(hf_dir, vocab_size=300, eos_token_id=300)
    assert _prepare(raw, str(tmp_path / "dataset"), "--init-from", hf_dir) == 2
    assert "eos_token_id 300 is not a token id of" in capsys.readouterr().err


def _train_arguments(data_dir, hf_dir, tmp_path):
    values = presets.resolve({"preset": "tiny", "global_batch_size": 4, "max_steps": 1, "eval_every": 0,
                              "checkpoint_every": 0, "checkpoint_minutes": 0, "xla": False})
    args = ["--data-dir", data_dir, "--checkpoint-dir", str(tmp_path / "ckpt"), "--export-dir", str(tmp_path / "model"),
            "--init-from", hf_dir]
    for name, value in values.items():
        args += ["--" + name, json.dumps(value)]
    return args


@pytest.mark.slow
def test_the_prepare_job_with_init_from_makes_a_dataset_lm_train_starts_from_the_checkpoint_on(checkpoint, tmp_path):
    """The real container toolkit (sagemaker-training) runs prepare.py with the channels and
    hyperparameters of the builder's request for a prepare job with init_from (no tokenizer given,
    none trained: the execution's defaults); lm.training.train --init-from then accepts the dataset."""
    hf_dir, eos_id = checkpoint
    values = {name: spec.default for name, spec in job.PREPARE_HYPERPARAMETERS.items()}
    values.update(seq_len=SEQ_LEN, shard_size=4096, val_fraction=0.1, workers=1, threads=1)
    prepare_job = request.TrainingJob(
        kind="prepare", name="prepare-1", image="image", role_arn="role", bucket="lmstack-artifacts",
        region="us-east-1", hyperparameters=values, instance_type=inputs.PREPARE_INSTANCE_TYPE, instance_count=1,
        max_runtime_seconds=3600, spot=False, file_system_id="fs-0123456789abcdef0", security_group_ids=["sg-1"],
        subnets=["subnet-1"], data_directory="/datasets/pile", execution_name="run-1", raw_directory="/raw",
        init_from=INIT_FROM)
    sent = request.create_training_job_request(prepare_job)
    channels = {channel["ChannelName"]: channel for channel in sent["InputDataConfig"]}
    assert channels[contract.INIT_CHANNEL] == {
        "ChannelName": contract.INIT_CHANNEL, "InputMode": "File",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": INIT_FROM,
                                        "S3DataDistributionType": "FullyReplicated"}}}
    assert {"Key": request.INIT_FROM_TAG, "Value": INIT_FROM} in sent["Tags"]

    base = tmp_path / "ml"
    code = base / "code"  # where the image bakes the code in
    shutil.copytree(os.path.join(IMAGE, "lm"), str(code / "lm"), ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(IMAGE, "prepare.py"), str(code / "prepare.py"))
    data = base / "input" / "data"  # each channel where SageMaker puts it
    sample_corpus.write_sample_corpus(str(data / contract.RAW_CHANNEL), max_bytes=60000, files=2)
    (data / contract.DATASET_CHANNEL).mkdir()  # the file system's root
    shutil.copytree(hf_dir, str(data / contract.INIT_CHANNEL))  # the S3 prefix, copied (File mode)
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps(sent["HyperParameters"]))
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}))
    (config / "inputdataconfig.json").write_text(json.dumps(
        {name: {"TrainingInputMode": channel["InputMode"]} for name, channel in channels.items()}))
    env = dict({key: value for key, value in os.environ.items() if not key.startswith("SM_")},
               SAGEMAKER_BASE_DIR=str(base), SAGEMAKER_PROGRAM="prepare.py", SAGEMAKER_SUBMIT_DIRECTORY=str(code),
               SM_STUDIO_LOCAL_MODE="true")
    result = subprocess.run([sys.executable, "-m", "sagemaker_training.cli.train"], env=env, cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0 and "Reporting training SUCCESS" in result.stdout, result.stdout[-4000:]
    dataset = str(data / contract.DATASET_CHANNEL / "datasets" / "pile")
    manifest = shards.load_manifest(dataset)
    assert shards.verify(dataset, manifest) == [] and manifest.prepare["complete"]
    assert manifest.tokenizer_sha256 == shards.sha256_file(os.path.join(hf_dir, "tokenizer.json"))
    assert manifest.eod_token_id == eos_id

    from lm.training import train
    training = train.Training(*train.parse_args(_train_arguments(dataset, hf_dir, tmp_path)))
    assert training.config.vocab_size == 300
    # What the prepare job made before it had the init channel, a tokenizer of its own, is refused
    # at the same point, before any step.
    own = str(tmp_path / "own")
    assert _prepare(str(data / contract.RAW_CHANNEL), own, "--train-tokenizer", "--vocab-size", "300") == 0
    with pytest.raises(hf.HFError, match="whose vocabulary differs from the checkpoint's"):
        train.Training(*train.parse_args(_train_arguments(own, hf_dir, tmp_path)))
