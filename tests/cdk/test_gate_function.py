"""The gate's Lambda function in the synthesized stack (stacks.gate): its code is the staged directory of
`stacks.gate_code` (controlplane and lm.spec, nothing else), which runs with the standard library alone and
answers as `controlplane.gate` does in this process; the training machine may invoke only its published
version; the function writes only its own logs."""
import ast
import json
import subprocess
import sys

import pytest

from cdk_synth import staged_file
from controlplane import gate
from lmstack.local_lambda import runtime_interpreter
from stacks import gate_code


def _function(synth):
    return synth.only("AWS::Lambda::Function")


def _code_directory(synth):
    _, function = _function(synth)
    key = function["Properties"]["Code"]["S3Key"]
    assets = "%s.assets.json" % synth.assembly.get_stack_by_name(synth.settings.name_prefix).id
    return staged_file(synth.outdir, assets, key)


def test_the_function_runs_the_gate_with_the_deployment_s_settings(default):
    function_id, function = _function(default)
    properties = function["Properties"]
    assert properties["Runtime"] == gate_code.RUNTIME and properties["Handler"] == gate_code.HANDLER
    assert json.loads(properties["Environment"]["Variables"][gate.ENVIRONMENT_KEY]) == json.loads(
        gate.Deployment.of(default.settings).environment()[gate.ENVIRONMENT_KEY])
    (version_id, version), = default.resources("AWS::Lambda::Version").items()
    assert version["Properties"]["FunctionName"] == {"Ref": function_id}
    training = next(resource for resource in default.resources("AWS::StepFunctions::StateMachine").values()
                    if resource["Properties"]["StateMachineName"] == "lmstack-training")
    # A published version (its Ref is the version's ARN), not $LATEST
    assert training["Properties"]["DefinitionSubstitutions"]["GateFunctionArn"] == {"Ref": version_id}
    role = properties["Role"]["Fn::GetAtt"][0]
    trust = default.template["Resources"][role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [statement["Principal"] for statement in trust] == [{"Service": "lambda.amazonaws.com"}]
    statements = [statement for policy in default.resources("AWS::IAM::Policy").values()
                  if {"Ref": role} in policy["Properties"]["Roles"]
                  for statement in policy["Properties"]["PolicyDocument"]["Statement"]]
    log_group = properties["LoggingConfig"]["LogGroup"]
    # its logs, the two read-only listings of Service Quotas its quota check makes and the Price List's
    # GetProducts its prices read (no resource-level permissions there: Resource "*"); nothing else
    assert statements == [{"Action": ["logs:CreateLogStream", "logs:PutLogEvents"], "Effect": "Allow",
                           "Resource": {"Fn::GetAtt": [log_group["Ref"], "Arn"]}},
                          {"Action": ["pricing:GetProducts", "servicequotas:ListAWSDefaultServiceQuotas",
                                      "servicequotas:ListServiceQuotas"], "Effect": "Allow", "Resource": "*"}]


def test_only_the_training_machine_invokes_only_the_published_version(default):
    (version_id, _), = default.resources("AWS::Lambda::Version").items()
    invocations = [(policy["Properties"]["Roles"], statement) for policy in default.resources("AWS::IAM::Policy").values()
                   for statement in policy["Properties"]["PolicyDocument"]["Statement"]
                   if any(action.startswith("lambda:") for action in _actions(statement))]
    (roles, statement), = invocations
    assert [role["Ref"] for role in roles] == [next(key for key in default.resources("AWS::IAM::Role")
                                                    if key.startswith("PermissionsTrainingMachineRole"))]
    assert (_actions(statement), statement["Resource"]) == (["lambda:InvokeFunction"], {"Ref": version_id})


def _actions(statement):
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


def test_the_code_is_the_staged_directory_and_nothing_else(default):
    directory = _code_directory(default)
    files = sorted(path.relative_to(directory).as_posix() for path in directory.rglob("*") if path.is_file())
    staged = gate_code.staged_files()
    assert files == sorted(staged)
    assert all((directory / name).read_bytes() == source.read_bytes() for name, source in staged.items())
    sources = [name for name in files if name.endswith(".py")]
    # the planner's measured MFU table travels with the code it is read by
    assert "controlplane/measured_mfu.json" in files
    modules = {name[:-3].replace("/", ".").replace(".__init__", "") for name in sources}
    foreign = []
    for name in sources:
        for node in ast.walk(ast.parse((directory / name).read_text())):
            imported = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            foreign += ["%s: %s" % (name, module) for module in imported
                        if module.split(".")[0] not in sys.stdlib_module_names and module not in modules
                        and not any(module.startswith(package + ".") or module == package for package in modules)]
    # the AWS SDK only where clients are made (the Lambda runtime has it) and the errors the prices catch; nothing
    # of TensorFlow or NumPy
    assert sorted(set(foreign)) == ["controlplane/aws_clients.py: boto3", "controlplane/aws_clients.py: botocore.config",
                                    "controlplane/pricing.py: botocore.exceptions"]


GIVEN = [{"preset": "gpt-125m", "strategy": "single", "instance_type": "ml.g5.2xlarge",
          "hyperparameters": {"global_batch_size": 16, "recompute": True}},
         {"preset": "gpt-1.3b", "strategy": "horovod", "instance_type": "ml.p3.16xlarge", "instance_count": 2},
         {"presett": "tiny"}]


@pytest.mark.parametrize("given", GIVEN, ids=["accepted", "plan-rejected", "invalid"])
def test_the_staged_code_runs_alone_and_answers_as_the_gate_here(default, given):
    """On the function's runtime (python3.13, not this process's 3.11), `python -I -S`: the standard library
    and the staged directory, no site-packages (no AWS SDK either: the quota check says it could not ask)."""
    program = ("import json, sys; sys.path.insert(0, sys.argv[1]); from controlplane.gate import handler; "
               "print(json.dumps(handler(json.loads(sys.argv[2]))))")
    _, function = _function(default)
    environment = function["Properties"]["Environment"]["Variables"]
    event = {"input": given, "execution_name": "run-1"}
    interpreter = runtime_interpreter(gate_code.RUNTIME)
    version = subprocess.run([interpreter, "-c", "import sys; print('python%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    assert version == gate_code.RUNTIME
    answered = subprocess.run([interpreter, "-I", "-S", "-c", program, str(_code_directory(default)),
                               json.dumps(event)], env=environment, capture_output=True, text=True, timeout=60)
    assert answered.returncode == 0, answered.stderr
    def without_sdk(service, region_name=None):  # what `aws_client` meets in a Python without boto3, as here
        raise ModuleNotFoundError("No module named 'boto3'", name="boto3")

    here = gate.answer(event, gate.Context(gate.Deployment.of(default.settings), execution_name="run-1",
                                           clients=without_sdk))
    assert json.loads(answered.stdout) == json.loads(json.dumps(here))
