"""init_from with a prepare stage, executed on moto (issue 17.3): the prepare job gets the `init`
channel too (lm.data.prepare then tokenizes with the checkpoint's tokenizer: tests/data/test_prepare_with_init.py),
the dataset key includes init_from, and a tokenizer of prepare's own is refused before any job.
Every request passes botocore's validation and the strict rules of tests/aws_rules.py."""
import hashlib
import json

import pytest
from state_machine.harness import invalid_sagemaker_requests
from state_machine.test_request import assert_equal_key_by_key

from controlplane import bucket_layout
from lm.spec import conditions
from lm.spec import contract
from controlplane import request
from controlplane import inputs
from stacks.state_machine import jobs, render, training

INIT_FROM = "s3://lmstack-artifacts/%sgpt2-random/" % bucket_layout.INIT_PREFIX
OTHER_INIT_FROM = "s3://lmstack-artifacts/%sgpt2-other/" % bucket_layout.INIT_PREFIX
RAW = "s3://lmstack-artifacts/%spile/" % bucket_layout.RAW_PREFIX


def _failure(run):
    return run.description.get("error"), run.description.get("cause"), run.states_entered()[-6:]


def _built(deployment, run, kind, execution_input):
    """What the builder returns for this run's concrete values, placeholders filled as deployed."""
    settings = deployment.settings
    config = inputs.with_defaults(inputs.schema(settings), execution_input)
    values = jobs.concrete_values(
        kind, settings, config, execution_name=run.arn.split(":")[-1], dataset_key=training.concrete_dataset_key(config),
        job_name="%s-%s-%s-1" % (settings.name_prefix, kind.token, hashlib.md5(run.arn.encode()).hexdigest()))
    return json.loads(render(request.create_training_job_request(values), deployment.values))


def _channels(sent):
    return {channel["ChannelName"]: channel for channel in sent["InputDataConfig"]}


def _tags(sent):
    return {tag["Key"]: tag["Value"] for tag in sent["Tags"]}


INIT_CHANNEL = {"ChannelName": contract.INIT_CHANNEL, "InputMode": "File", "DataSource": {"S3DataSource": {
    "S3DataType": "S3Prefix", "S3Uri": INIT_FROM, "S3DataDistributionType": "FullyReplicated"}}}


@pytest.mark.slow
@pytest.mark.parametrize("raw", [{"raw_s3_uri": RAW, "instance_count": 2}, {"raw_directory": "/raw/pile"}],
                         ids=["s3", "efs"])
def test_the_prepare_job_gets_the_init_channel_as_the_builder_builds_it(make_deployment, raw):
    deployment = make_deployment(prepared=())
    deployment.file_system.make("/raw/pile")
    execution_input = {"preset": "tiny", "init_from": INIT_FROM, "prepare": dict(raw, enabled=True)}
    run = deployment.run(execution_input, name="init-prepare")
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, prepare), (_, _, train) = run.calls("createTrainingJob")
    assert _tags(prepare)[request.KIND_TAG] == "prepare" and _tags(train)[request.KIND_TAG] == "train"
    assert_equal_key_by_key(_built(deployment, run, jobs.PREPARE, execution_input), prepare)
    assert_equal_key_by_key(_built(deployment, run, jobs.TRAIN, execution_input), train)
    assert [channel["ChannelName"] for channel in prepare["InputDataConfig"]] == [
        contract.RAW_CHANNEL, contract.DATASET_CHANNEL, contract.INIT_CHANNEL]
    assert _channels(prepare)[contract.INIT_CHANNEL] == INIT_CHANNEL == _channels(train)[contract.INIT_CHANNEL]
    assert _tags(prepare)[request.INIT_FROM_TAG] == INIT_FROM == _tags(train)[request.INIT_FROM_TAG]
    # lm.data.prepare gets no tokenizer of its own to train or to read: it tokenizes with the init channel's.
    assert json.loads(prepare["HyperParameters"]["tokenizer"]) == ""
    assert json.loads(prepare["HyperParameters"]["train_tokenizer"]) is False
    config = inputs.with_defaults(inputs.schema(deployment.settings), execution_input)
    assert _tags(prepare)[request.DATASET_KEY_TAG] == training.concrete_dataset_key(config)
    assert invalid_sagemaker_requests(run) == []


@pytest.mark.slow
def test_the_dataset_key_includes_init_from(make_deployment):
    """A dataset prepared for one checkpoint's tokenizer is no reason to skip preparing for another's:
    into the same directory that is refused (it holds the other dataset), into another it runs."""
    deployment = make_deployment(prepared=())
    prepare = {"enabled": True, "raw_s3_uri": RAW}
    first = deployment.run({"init_from": INIT_FROM, "prepare": prepare}, name="key-1")
    again = deployment.run({"init_from": INIT_FROM, "prepare": prepare}, name="key-2")
    refused = deployment.run({"init_from": OTHER_INIT_FROM, "prepare": prepare}, name="key-3")
    other = deployment.run({"init_from": OTHER_INIT_FROM, "prepare": prepare, "data_directory": "/datasets/other"},
                           name="key-4")
    for run in (first, again, other):
        assert run.status == "SUCCEEDED", _failure(run)
    assert [sent["TrainingJobName"].split("-")[1] for _, _, sent in first.calls("createTrainingJob")] == [
        "prep", "train"]
    assert "already completed" in again.output["prepare"]["skipped"]
    assert refused.description["error"] == training.OTHER_DATASET and refused.calls("createTrainingJob") == []
    assert [sent["TrainingJobName"].split("-")[1] for _, _, sent in other.calls("createTrainingJob")] == [
        "prep", "train"]
    keys = [_tags(run.calls("createTrainingJob")[0][2])[request.DATASET_KEY_TAG] for run in (first, other)]
    assert keys[0] != keys[1]
    config = inputs.with_defaults(inputs.schema(deployment.settings), {"prepare": prepare})
    assert first.output["prepare"]["dataset_key"] != training.concrete_dataset_key(config)


@pytest.mark.slow
@pytest.mark.parametrize("execution_input, cause", [
    ({"init_from": INIT_FROM, "prepare": {"enabled": True, "raw_s3_uri": RAW,
                                          "hyperparameters": {"train_tokenizer": True}}},
     "init_from brings its tokenizer, which the prepare job tokenizes with: leave "
     "prepare.hyperparameters.train_tokenizer false"),
    ({"init_from": INIT_FROM, "prepare": {"enabled": True, "raw_s3_uri": RAW,
                                          "hyperparameters": {"tokenizer": "/tokenizers/gpt2.json"}}},
     "init_from brings its tokenizer, which the prepare job tokenizes with: leave "
     "prepare.hyperparameters.tokenizer empty, got /tokenizers/gpt2.json"),
    ({"init_from": INIT_FROM + "gpt2(copy)/"},
     "init_from may hold only letters, digits, spaces and _ . : / = + - @ (it becomes the tag "
     "lmstack:init-from of its jobs), got %sgpt2(copy)/" % INIT_FROM),
], ids=["train_tokenizer", "tokenizer", "tag-characters"])
def test_what_cannot_go_with_init_from_is_refused_before_any_job(deployment, execution_input, cause):
    run = deployment.run(dict(execution_input, preset="tiny"), name="init-refused")
    assert run.status == "FAILED"
    assert (run.description["error"], run.description["cause"]) == (conditions.INVALID, cause)
    assert run.calls("createTrainingJob") == []


@pytest.mark.slow
def test_prepare_settings_count_only_when_the_stage_runs(deployment):
    run = deployment.run({"preset": "tiny", "init_from": INIT_FROM,
                          "prepare": {"hyperparameters": {"tokenizer": "/tokenizers/gpt2.json"}}}, name="init-no-prep")
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, train), = run.calls("createTrainingJob")
    assert _channels(train)[contract.INIT_CHANNEL] == INIT_CHANNEL
