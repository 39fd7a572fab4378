"""A run that only deploys (`deploy.model_artifact`): an existing model is served with no prepare or training
job, through the same checks as after training (the hosting type and the container's fit, the endpoint's quota,
the endpoint role), executed on moto. Every SageMaker request passes botocore's validation and the strict
rules (`invalid_sagemaker_requests`)."""
import pytest

import quota_tables
from state_machine.harness import StandInSettings, invalid_sagemaker_requests

from controlplane import gate
from lm.spec import conditions

CONTEXT = gate.Context(gate.Deployment.of(StandInSettings()))
ARCHIVE = "s3://lmstack-artifacts/output/lmstack-train-0123456789abcdef0123456789abcdef-1/output/model.tar.gz"
DIRECTORY = "s3://lmstack-artifacts/models/tiny-hf/"
# moto accepts only its own (older) list of hosting instance types: of ours, ml.g4dn.12xlarge and ml.p3.*.
DEPLOY = {"enabled": True, "endpoint_name": "served", "instance_type": "ml.g4dn.12xlarge"}
SERVE = {"preset": "tiny", "deploy": dict(DEPLOY, model_artifact=ARCHIVE)}


def _failure(run):
    return run.description.get("error"), run.description.get("cause"), run.states_entered()[-6:]


def test_a_deploy_only_input_is_planned_as_serving_only():
    decision = gate.decide(SERVE, CONTEXT)
    assert decision.plan["deploy_only"] is True and decision.plan["model_artifact"] == ARCHIVE
    assert "strategy" not in decision.plan and decision.planned == []
    tgi = gate.decide(dict(SERVE, deploy=dict(SERVE["deploy"], container="tgi")), CONTEXT)
    assert tgi.plan["serving_environment"]["HF_MODEL_ID"] == "/opt/ml/model"
    assert any("hyperparameters.export_hf true" in note for note in tgi.notes)  # what a tarball must hold for TGI


@pytest.mark.parametrize("changes, named", [
    ({"instance_type": "ml.p4d.24xlarge"}, "deploy.model_artifact serves an existing model and starts no prepare or "
                                           "training job: instance_type is for those"),
    ({"hyperparameters": {"max_steps": 3}, "budget_usd": 5.0}, "budget_usd, hyperparameters.max_steps are for those"),
    ({"deploy": dict(DEPLOY, model_artifact=ARCHIVE, enabled=False)}, "deploy.model_artifact needs deploy.enabled true"),
    ({"deploy": dict(DEPLOY, model_artifact="s3://lmstack-artifacts/checkpoints/run-1/")},
     "deploy.model_artifact must be a training job's model.tar.gz"),
    ({"deploy": dict(DEPLOY, model_artifact=DIRECTORY)},
     "deploy.model_artifact %s is a Hugging Face directory, which deploy.container tgi or lmi serves" % DIRECTORY),
    ({"deploy": dict(DEPLOY, model_artifact=ARCHIVE, instance_type="ml.p3dn.24xlarge")}, "deploy.instance_type"),
])
def test_what_a_deploy_only_input_cannot_be_is_refused_naming_the_field(changes, named):
    with pytest.raises(gate.Refusal) as refused:
        gate.decide(dict(SERVE, **changes), CONTEXT)
    assert named in str(refused.value) and refused.value.error == conditions.INVALID


def test_only_the_endpoint_s_quota_is_asked():
    table = quota_tables.account({"ml.g4dn.12xlarge for endpoint usage": 0, "ml.g5.2xlarge for training job usage": 0})
    with pytest.raises(gate.Refusal, match='deploy.instance_type ml.g4dn.12xlarge: 1 instance\\(s\\) for the endpoint, '
                                           'and the quota "ml.g4dn.12xlarge for endpoint usage"'):
        gate.decide(SERVE, gate.Context(CONTEXT.deployment, clients=quota_tables.clients(table)))
    enough = quota_tables.account({"ml.g5.2xlarge for training job usage": 0})  # no training: not asked
    gate.decide(SERVE, gate.Context(CONTEXT.deployment, clients=quota_tables.clients(enough)))


# ---- through the state machine ----

def test_a_model_archive_is_served_without_a_training_job(deployment):
    run = deployment.run(SERVE, name="serve-1")
    assert run.status == "SUCCEEDED", _failure(run)
    assert deployment.jobs.created == [] and run.calls("createTrainingJob") == []
    assert not [name for name in run.states_entered() if name.split(".")[0] in ("Run", "Prepare", "Train")]
    (_, _, model), = run.calls("createModel")
    assert model["PrimaryContainer"]["ModelDataUrl"] == ARCHIVE
    assert model["ExecutionRoleArn"] == deployment.values["EndpointRoleArn"]
    (_, _, config), = run.calls("createEndpointConfig")
    assert config["ProductionVariants"][0]["InstanceType"] == "ml.g4dn.12xlarge"
    output = run.output
    assert output["model_artifacts"] == ARCHIVE and output["deploy"]["status"] == "InService"
    assert output["deploy"]["endpoint_name"] == "lmstack-served" and output["plan"]["deploy_only"] is True
    assert invalid_sagemaker_requests(run) == []


@pytest.mark.parametrize("container", ["tgi", "lmi"])
def test_a_hugging_face_directory_is_served_uncompressed_on_tgi_and_lmi(deployment, container):
    run = deployment.run(dict(SERVE, deploy=dict(DEPLOY, model_artifact=DIRECTORY, container=container)),
                         name="serve-%s" % container)
    assert run.status == "SUCCEEDED", _failure(run)
    (_, _, model), = run.calls("createModel")
    primary = model["PrimaryContainer"]
    assert "ModelDataUrl" not in primary
    assert primary["ModelDataSource"] == {"S3DataSource": {"S3Uri": DIRECTORY, "S3DataType": "S3Prefix",
                                                           "CompressionType": "None"}}
    assert primary["Environment"] == run.gate_answers()[0]["plan"]["serving_environment"]
    assert deployment.jobs.created == [] and invalid_sagemaker_requests(run) == []


def test_a_model_outside_the_stack_s_bucket_is_refused_before_anything(deployment):
    elsewhere = ARCHIVE.replace("lmstack-artifacts", "someone-else")
    run = deployment.run(dict(SERVE, deploy=dict(DEPLOY, model_artifact=elsewhere)), name="serve-elsewhere")
    assert (run.status, run.description["error"]) == ("FAILED", conditions.INVALID)
    assert run.description["cause"] == (
        "deploy.model_artifact must be in the artifact bucket of this stack, s3://lmstack-artifacts/output/*/output/"
        "model.tar.gz or s3://lmstack-artifacts/models/*/, got %s" % elsewhere)
    assert run.calls("createModel") == []
