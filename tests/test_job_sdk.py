"""The hyperparameters our state machine sends equal what the SageMaker Python SDK v2 sends.

For each strategy: (1) execute the shipped definition on moto and take the HyperParameters
of its CreateTrainingJob request from the execution history; (2) build the same job with
`sagemaker.tensorflow.TensorFlow(...).fit(...)` against moto (offline) and take the
HyperParameters moto stored. They must agree key for key, except
`sagemaker_submit_directory` (the SDK uploads the code; ours is baked into the image).
Values that decode to JSON objects (mp_parameters) are compared decoded, since key spacing
may differ; every other value must be the same string.
"""
import collections
import json

import boto3
import pytest
from moto import mock_aws

from controlplane import request
from controlplane import budget
from controlplane import base_images
from lm.spec import interruptions, job
from lm.spec.hardware import INSTANCES
from controlplane import presets

pytest.importorskip("sagemaker")
from sagemaker.session import Session  # noqa: E402
from sagemaker.tensorflow import TensorFlow  # noqa: E402

INSTANCE_TYPE = "ml.p4d.24xlarge"
# The mean time between interruptions the gate writes for an on-demand run (controlplane.checkpoint_plan).
ON_DEMAND_INTERRUPTION_HOURS = interruptions.instance_hours(False, INSTANCES[INSTANCE_TYPE].gpus)
GPUS = 8
FRAMEWORK = {"tf26": ("2.6.0", "py38"), "tf211": ("2.11.0", "py39"), "tfcurrent": ("2.16", "py310")}


def instance_count(strategy):
    return 1 if strategy == "single" else 2


# Overrides that make the run fit: the job's default global batch (64 sequences of 2,048 tokens)
# needs about 344 GiB on one A100 without recomputation (`python -m lmstack.plan --preset gpt-125m
# --instance-type ml.p4d.24xlarge --strategy single`), and the gate refuses it before any job.
FITTING = {"single": {"global_batch_size": 16, "recompute": True}}


def sdk_distribution(strategy):
    """The `distribution` argument a user of the SDK would pass for our strategy."""
    if strategy == "single":
        return None
    if strategy == "mwms":
        return {"multi_worker_mirrored_strategy": {"enabled": True}}
    if strategy == "horovod":
        return {"mpi": {"enabled": True, "processes_per_host": GPUS, "custom_mpi_options": ""}}
    if strategy == "smddp":
        return {"smdistributed": {"dataparallel": {"enabled": True}}}
    return {"smdistributed": {"modelparallel": {"enabled": True, "parameters": dict(request.SMP_DEFAULTS)}},
            "mpi": {"enabled": True, "processes_per_host": GPUS, "custom_mpi_options": request.SMP_MPI_OPTIONS}}


def sdk_hyperparameters(strategy, job_name, tmp_path, max_runtime_seconds=None, overrides=None):
    code = tmp_path / "train.py"
    code.write_text("print('lmstack')\n")
    user = collections.OrderedDict((name, spec.default) for name, spec in job.HYPERPARAMETERS.items())
    user.update(preset="gpt-125m", strategy=strategy, model_config=presets.model_config("gpt-125m"))
    user.update(overrides or {})
    if max_runtime_seconds is not None:  # the job's deadline, which the gate resolves from its MaxRuntime
        user.update(stop_after_seconds=budget.stop_after_seconds(max_runtime_seconds))
    with mock_aws():
        boto_session = boto3.Session(region_name="us-east-1")
        boto_session.client("s3").create_bucket(Bucket="lmstack-artifacts")
        session = Session(boto_session=boto_session, default_bucket="lmstack-artifacts")
        version, python = FRAMEWORK[base_images.STRATEGY_RUNTIME[strategy]]
        estimator = TensorFlow(
            entry_point=str(code), role="arn:aws:iam::123456789012:role/lmstack-sagemaker",
            instance_count=instance_count(strategy), instance_type=INSTANCE_TYPE, framework_version=version, py_version=python,
            image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/lmstack:%s" % base_images.STRATEGY_RUNTIME[strategy],
            distribution=sdk_distribution(strategy), hyperparameters=dict(user),
            output_path="s3://lmstack-artifacts/output", sagemaker_session=session, disable_profiler=True)
        estimator.fit(job_name=job_name, wait=False, logs=False)
        return boto_session.client("sagemaker").describe_training_job(TrainingJobName=job_name)["HyperParameters"]


def _decoded_if_object(raw):
    value = job.decode_hyperparameter(raw)
    return value if isinstance(value, dict) else raw


@pytest.mark.slow
@pytest.mark.parametrize("strategy", job.STRATEGIES)
def test_definition_hyperparameters_equal_the_sdk(strategy, deployment, tmp_path):
    # `deployment`: the moto deployment fixture of tests/state_machine/harness.py.
    run = deployment.run({"preset": "gpt-125m", "strategy": strategy, "instance_type": INSTANCE_TYPE,
                          "instance_count": instance_count(strategy), "hyperparameters": FITTING.get(strategy, {})},
                         name="sdk-%s" % strategy)
    assert run.status == "SUCCEEDED", run.description.get("cause")
    (_, _, request), = run.calls("createTrainingJob")
    ours = request["HyperParameters"]
    theirs = sdk_hyperparameters(strategy, request["TrainingJobName"], tmp_path,
                                 request["StoppingCondition"]["MaxRuntimeInSeconds"], dict(
                                     FITTING.get(strategy, {}), interruption_hours=ON_DEMAND_INTERRUPTION_HOURS))
    assert "sagemaker_submit_directory" in theirs
    theirs = {key: value for key, value in theirs.items() if key != "sagemaker_submit_directory"}
    assert sorted(ours) == sorted(theirs)
    assert {key: _decoded_if_object(value) for key, value in ours.items()} == {
        key: _decoded_if_object(value) for key, value in theirs.items()}


@pytest.mark.slow
def test_lm_job_matches_the_sdk_for_every_strategy(tmp_path):
    """The builder's own `controlplane.request.sdk_hyperparameters` with concrete values (what the toolkit tests use)."""
    for strategy in job.STRATEGIES:
        name = "lmstack-train-%s" % strategy
        user = collections.OrderedDict((key, spec.default) for key, spec in job.HYPERPARAMETERS.items())
        user.update(preset="gpt-125m", strategy=strategy, model_config=presets.model_config("gpt-125m"))
        ours = request.sdk_hyperparameters(
            user, strategy=strategy, instance_type=INSTANCE_TYPE, processes_per_host=job.processes_per_host(strategy, GPUS),
            job_name=name, region="us-east-1", output_path="s3://lmstack-artifacts/output")
        theirs = sdk_hyperparameters(strategy, name, tmp_path)
        theirs.pop("sagemaker_submit_directory")
        assert {key: _decoded_if_object(value) for key, value in ours.items()} == {
            key: _decoded_if_object(value) for key, value in theirs.items()}, strategy
        assert json.loads(ours["sagemaker_job_name"]) == name
