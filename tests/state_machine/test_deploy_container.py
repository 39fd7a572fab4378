"""deploy.container: TGI (issue 17.4) and LMI (issue 27.5) on the Hugging Face export, executed on moto.

Every SageMaker request is checked by botocore's validator against the service model and by the
strict request rules (`invalid_sagemaker_requests`). TGI's own container is not run here (no GPU,
no image pull); what is checked is the request SageMaker would get: the image of this region from
`controlplane.containers`' table, the model data of the training job, and the Environment that the TGI
SageMaker entrypoint reads (HF_MODEL_ID, SM_NUM_GPUS) and its launcher's limits and dtype
(MAX_INPUT_LENGTH, MAX_TOTAL_TOKENS, DTYPE). LMI likewise: its image and the OPTION_* Environment
(model directory, vLLM engine, tensor-parallel degree, max_model_len, dtype) of `controlplane.containers`.
"""

import pytest
from state_machine.harness import StandInSettings, invalid_sagemaker_requests

from controlplane import containers, gate, inputs, rules
from controlplane.presets import get_preset
from lm.spec import conditions
from lmstack import start

# moto accepts only its own (older) list of hosting instance types: of ours, ml.g4dn.12xlarge and ml.p3.*.
TGI_DEPLOY = {"enabled": True, "endpoint_name": "tgi", "instance_type": "ml.g4dn.12xlarge", "container": "tgi"}
TINY_TGI = {"preset": "tiny", "hyperparameters": {"export_hf": True, "max_steps": 10}, "deploy": TGI_DEPLOY}


def _failure(run):
    return run.description.get("error"), run.description.get("cause"), run.states_entered()[-6:]


@pytest.mark.slow
def test_tgi_serves_the_hugging_face_export_of_the_training_job(deployment):
    run = deployment.run(TINY_TGI, name="tgi-1")
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, training), = run.calls("createTrainingJob")
    assert training["HyperParameters"]["export_hf"] == "true"
    (_, _, model), = run.calls("createModel")
    container = model["PrimaryContainer"]
    assert container["Image"] == (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-tgi-inference:"
        "2.4.0-tgi3.0.1-gpu-py311-cu124-ubuntu22.04")
    assert container["ModelDataUrl"] == run.output["model_artifacts"]
    # tiny: context 128 tokens, half of it prompt; 141k parameters fit one T4.
    assert container["Environment"] == {"HF_MODEL_ID": "/opt/ml/model", "SM_NUM_GPUS": "1",
                                        "MAX_INPUT_LENGTH": "64", "MAX_TOTAL_TOKENS": "128", "DTYPE": "float16"}
    (_, _, config), = run.calls("createEndpointConfig")
    assert config["ProductionVariants"][0]["InstanceType"] == "ml.g4dn.12xlarge"
    assert run.output["deploy"]["status"] == "InService"
    assert invalid_sagemaker_requests(run) == []


@pytest.mark.slow
def test_the_default_container_is_still_lmstack(deployment):
    run = deployment.run(dict(TINY_TGI, deploy=dict(TGI_DEPLOY, container="lmstack")), name="lmstack-1")
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, model), = run.calls("createModel")
    assert model["PrimaryContainer"]["Image"].endswith("/lmstack:tfcurrent")
    assert "HF_MODEL_ID" not in model["PrimaryContainer"]["Environment"]
    assert invalid_sagemaker_requests(run) == []


@pytest.mark.slow
def test_lmi_serves_the_hugging_face_export_with_vllm(deployment):
    run = deployment.run(dict(TINY_TGI, deploy=dict(TGI_DEPLOY, container="lmi")), name="lmi-1")
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, model), = run.calls("createModel")
    container = model["PrimaryContainer"]
    assert container["Image"] == "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.38.0-lmi29.0.0-cu130"
    assert container["ModelDataUrl"] == run.output["model_artifacts"]
    assert container["Environment"] == {
        "OPTION_MODEL_ID": "/opt/ml/model", "OPTION_ROLLING_BATCH": "vllm", "OPTION_TENSOR_PARALLEL_DEGREE": "1",
        "OPTION_MAX_MODEL_LEN": "128", "OPTION_DTYPE": "fp16"}
    assert run.output["deploy"]["status"] == "InService"
    assert invalid_sagemaker_requests(run) == []


@pytest.mark.parametrize("container", list(containers.HF_CONTAINERS))
def test_images_cover_every_deployable_region(container):
    from stacks.settings import REGIONS

    for region in REGIONS:
        assert containers.image(container, region).startswith("763104351884.dkr.ecr.%s.amazonaws.com/" % region)
    with pytest.raises(ValueError, match="no %s image for region 'xx-east-9'" % container.upper()):
        containers.image(container, "xx-east-9")


def test_the_lmi_table_is_the_sagemaker_sdks():
    """Every LMI tag and registry is what the SageMaker Python SDK (in .venv) resolves."""
    pytest.importorskip("sagemaker")
    from sagemaker import image_uris

    for region in containers.LMI_REGISTRIES:
        for version in containers.LMI_TAGS:
            assert containers.image(containers.LMI, region, version) == image_uris.retrieve(
                "djl-lmi", region=region, version=version)


def test_shards_follow_the_gpu_memory():
    """gpt-13b in fp16: 12.85e9 parameters x 2 bytes = 23.9 GiB of weights, 1.6 GiB of KV cache for
    2048 tokens, 2 GiB overhead per GPU. A T4 (16 GiB, 14.4 usable): on 2 GPUs 14.8 GiB each is too
    much, on 4 it is 8.4 GiB. An A100 80 GB holds it on one."""
    config = get_preset("gpt-13b")
    assert containers.gpu_shards(containers.TGI, config, "ml.g4dn.12xlarge") == (4, None)
    assert containers.gpu_shards(containers.TGI, config, "ml.p4de.24xlarge") == (1, None)
    shards, reason = containers.gpu_shards(containers.TGI, config, "ml.p3.2xlarge")
    assert shards is None and "on 1 GPUs" in reason
    assert containers.gpu_shards(containers.TGI, config, "ml.m5.xlarge") == (None, "TGI needs a GPU instance; ml.m5.xlarge has none")
    # The shard count divides n_head (tensor parallelism splits the heads): 40 heads on 8 V100s -> 4.
    assert containers.gpu_shards(containers.TGI, config, "ml.p3.16xlarge") == (4, None)


@pytest.mark.parametrize("container", list(containers.HF_CONTAINERS))
def test_the_gate_gives_the_deploy_stage_the_container_s_environment(container):
    """`controlplane.gate.check_serving`: the Environment of the container for the preset and deploy.instance_type
    (`controlplane.containers.environment` with the computed shards), which the deploy stage's CreateModel sends
    ($.plan.serving_environment); a pair the container cannot serve is refused."""
    context = gate.Context(gate.Deployment.of(StandInSettings()))

    def decided(preset, instance_type):
        config = inputs.with_defaults(inputs.schema(context.deployment), {"preset": preset, "deploy": {
            "enabled": True, "container": container, "instance_type": instance_type}})
        decision = gate.Decision(given={}, config=config, plan={})
        gate.check_serving(decision, context)
        return decision.plan["serving_environment"]

    cases = [("gpt-13b", "ml.g4dn.12xlarge"), ("gpt-13b", "ml.g5.12xlarge"), ("gpt-6.7b", "ml.p3.8xlarge"),
             ("gpt-125m", "ml.g5.xlarge"), ("tiny", "ml.p5.48xlarge")]
    for preset, instance_type in cases:
        shards, _ = containers.gpu_shards(container, get_preset(preset), instance_type)
        assert decided(preset, instance_type) == dict(containers.environment(container, get_preset(preset), shards))
    with pytest.raises(gate.Refusal, match="cannot serve preset gpt-13b on deploy.instance_type ml.p3.2xlarge"):
        decided("gpt-13b", "ml.p3.2xlarge")


REJECTED = [
    (dict(TINY_TGI, hyperparameters={"max_steps": 10}),
     "deploy.container tgi serves the Hugging Face export: set hyperparameters.export_hf to true"),
    (dict(TINY_TGI, deploy=dict(TGI_DEPLOY, instance_type="ml.m5.xlarge")),
     "deploy.container tgi: TGI needs a GPU instance; ml.m5.xlarge has none; choose another deploy.instance_type"),
    (dict(TINY_TGI, deploy=dict(TGI_DEPLOY, container="vllm")),
     "deploy.container must be one of lmstack, tgi, lmi, got 'vllm'"),
    (dict(TINY_TGI, hyperparameters={"max_steps": 10}, deploy=dict(TGI_DEPLOY, container="lmi")),
     "deploy.container lmi serves the Hugging Face export: set hyperparameters.export_hf to true"),
    (dict(TINY_TGI, deploy=dict(TGI_DEPLOY, container="lmi", instance_type="ml.m5.xlarge")),
     "deploy.container lmi: LMI needs a GPU instance; ml.m5.xlarge has none; choose another deploy.instance_type"),
]


@pytest.mark.slow
@pytest.mark.parametrize("execution_input,message", REJECTED)
def test_the_validate_stage_refuses_what_tgi_cannot_serve(deployment, execution_input, message):
    run = deployment.run(execution_input, name="bad")
    assert run.status == "FAILED"
    assert run.description["error"] == conditions.INVALID
    assert message in run.description["cause"]
    assert run.calls("createTrainingJob") == []
    with pytest.raises(start.StartError) as raised:
        start.validate_input(execution_input, deployment.settings)
    assert str(raised.value) == run.description["cause"]  # the same gate


@pytest.mark.parametrize("container", list(containers.HF_CONTAINERS))
def test_the_fit_rule_rejects_a_preset_too_large_for_the_endpoint(container):
    """The gate's plan would reject gpt-13b on the default training instance first, so the rule is
    shown on the rule table itself (what the gate reads, for the state machine and lmstack.start)."""
    table = rules.cross_field_rules()
    config = {"preset": "gpt-13b", "hyperparameters": {"export_hf": True, "model": "gpt"},
              "deploy": {"enabled": True, "container": container, "instance_type": "ml.p3.2xlarge"}}
    message = conditions.broken(table, config)
    assert message.startswith(
        "deploy.container %s cannot serve preset 'gpt-13b' on deploy.instance_type ml.p3.2xlarge" % container)
    assert "gpt-6.7b" in message  # the other preset that does not fit one V100
    assert conditions.broken(table, dict(config, deploy=dict(config["deploy"], instance_type="ml.g5.12xlarge"))) is None
    assert conditions.broken(table, dict(config, deploy=dict(config["deploy"], container="lmstack"))) is None


def test_export_hf_needs_a_family_with_hf_export():
    from lm.spec import job

    with pytest.raises(ValueError, match=r"model rnn cannot use hyperparameters.export_hf true \(capability hf_export: "
                                         r".*\); families with it: gpt"):
        job.validate_hyperparameters({"model": "rnn", "preset": "rnn-tiny", "export_hf": True})
    assert job.validate_hyperparameters({"model": "gpt", "preset": "tiny", "export_hf": True})["export_hf"] is True
