"""init_from: a Hugging Face GPT-2 directory under an S3 prefix as the training job's `init`
channel, executed on moto (issue 17.3). What lm.training.train does with it is tests/hf/test_init_from.py."""
import pytest
from state_machine.harness import StandInSettings, invalid_sagemaker_requests
from state_machine.test_request import assert_equal_key_by_key, concrete_request

from controlplane import bucket_layout
from lm.spec import conditions
from lm.spec import contract
from lmstack import start
from stacks.state_machine import jobs

INIT_FROM = "s3://lmstack-artifacts/%sgpt2-random/" % bucket_layout.INIT_PREFIX


def _failure(run):
    return run.description.get("error"), run.description.get("cause"), run.states_entered()[-6:]


@pytest.mark.slow
def test_init_from_adds_the_hugging_face_directory_as_a_channel(deployment):
    execution_input = {"preset": "tiny", "init_from": INIT_FROM, "hyperparameters": {"max_steps": 10}}
    run = deployment.run(execution_input, name="init-1")
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, sent), = run.calls("createTrainingJob")
    channels = {channel["ChannelName"]: channel for channel in sent["InputDataConfig"]}
    assert channels[contract.INIT_CHANNEL]["DataSource"]["S3DataSource"] == {
        "S3DataType": "S3Prefix", "S3Uri": INIT_FROM, "S3DataDistributionType": "FullyReplicated"}
    assert channels[contract.INIT_CHANNEL]["InputMode"] == "File"
    assert_equal_key_by_key(concrete_request(deployment, run, jobs.TRAIN, execution_input), sent)
    assert invalid_sagemaker_requests(run) == []

    scratch = deployment.run({"preset": "tiny"}, name="init-2")
    (_, _, sent), = scratch.calls("createTrainingJob")
    assert [channel["ChannelName"] for channel in sent["InputDataConfig"]] == [contract.TRAIN_CHANNEL]


@pytest.mark.slow
def test_init_from_outside_the_readable_prefix_is_refused_before_any_job(make_deployment):
    deployment = make_deployment(StandInSettings())
    run = deployment.run({"preset": "tiny", "init_from": "s3://someone-elses-bucket/models/gpt2/"}, name="init-3")
    assert run.status == "FAILED"
    assert run.description["error"] == conditions.INVALID
    assert run.description["cause"] == ("init_from must start with s3://lmstack-artifacts/models/ (the prefix the "
                                        "training jobs may read), got s3://someone-elses-bucket/models/gpt2/")
    assert run.calls("createTrainingJob") == []


@pytest.mark.slow
def test_init_from_must_be_an_s3_uri(deployment):
    execution_input = {"preset": "tiny", "init_from": "https://example.com/gpt2"}
    run = deployment.run(execution_input, name="init-4")
    assert run.status == "FAILED"
    assert run.description["cause"] == "init_from must start with s3://, got 'https://example.com/gpt2'"
    with pytest.raises(start.StartError) as raised:
        start.validate_input(execution_input, deployment.settings)
    assert str(raised.value) == run.description["cause"]


@pytest.mark.slow
def test_init_from_with_strategy_smp_is_refused_before_any_job(deployment):
    run = deployment.run({"preset": "gpt-125m", "strategy": "smp", "instance_type": "ml.p4d.24xlarge",
                          "init_from": INIT_FROM}, name="init-5")
    assert run.status == "FAILED", _failure(run)
    assert run.description["error"] == conditions.INVALID
    assert run.description["cause"] == ("init_from is not supported with strategy smp (its model is partitioned "
                                        "across ranks); choose another strategy")
    assert run.calls("createTrainingJob") == []
