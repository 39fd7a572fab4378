"""The execution role's grants for init_from (read the Hugging Face directories under INIT_PREFIX,
nothing else there) and deploy.container tgi and lmi (pull the Hugging Face LLM DLC, LMI), on the synthesized
template (issue 17.3, 17.4); and the MLflow grant of the mlflow_resource_arn setting (issue 27.3)."""
import json

from test_stack import _as_list, _role_id, _statements

from controlplane import containers
from stacks.settings import MLFLOW_ENDPOINT_SERVICE, Settings
from stacks.iam import MLFLOW_ACTIONS
from controlplane.bucket_layout import INIT_PREFIX


def test_jobs_may_read_but_not_write_the_init_prefix(default):
    statements = _statements(default, _role_id(default, "PermissionsExecutionRole"))
    touching = [s for s in statements if "/%s*" % INIT_PREFIX in json.dumps(s.get("Resource"))]
    assert [_as_list(s["Action"]) for s in touching] == [["s3:GetObject"]]
    (listing,) = [s for s in statements if "s3:ListBucket" in _as_list(s["Action"])]
    assert INIT_PREFIX + "*" in listing["Condition"]["StringLike"]["s3:prefix"]


def test_the_endpoint_role_may_pull_the_tgi_and_lmi_images_and_the_jobs_may_not(default):
    jobs = json.dumps(_statements(default, _role_id(default, "PermissionsExecutionRole")))
    assert containers.TGI_REPOSITORY not in jobs and containers.LMI_REPOSITORY not in jobs
    statements = _statements(default, _role_id(default, "PermissionsEndpointRole"))
    (pull,) = [s for s in statements if "ecr:BatchGetImage" in _as_list(s["Action"])]
    pulled = json.dumps(pull["Resource"])
    for repository in (containers.TGI_REPOSITORY, containers.LMI_REPOSITORY):
        for account in set(containers.TGI_REGISTRIES.values()):
            assert ":%s:repository/%s" % (account, repository) in pulled


def test_the_role_may_log_to_the_mlflow_server_and_no_other(synth_app, default):
    arn = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/lm-experiments"
    synthesized = synth_app(Settings(mlflow_resource_arn=arn, interface_endpoints=(MLFLOW_ENDPOINT_SERVICE,)))
    statements = _statements(synthesized, _role_id(synthesized, "PermissionsExecutionRole"))
    (mlflow,) = [s for s in statements if any(a.startswith("sagemaker-mlflow:") for a in _as_list(s["Action"]))]
    assert sorted(_as_list(mlflow["Action"])) == sorted(MLFLOW_ACTIONS)
    assert _as_list(mlflow["Resource"]) == [arn]
    endpoints = [json.dumps(e["Properties"]["ServiceName"]) for e in synthesized.resources("AWS::EC2::VPCEndpoint").values()]
    assert [name for name in endpoints if "aws.sagemaker." in name and ".experiments" in name], endpoints
    unset = _statements(default, _role_id(default, "PermissionsExecutionRole"))
    assert not [s for s in unset if "sagemaker-mlflow" in json.dumps(s["Action"])]
