"""Every synthesized state machine definition passes `asl-validator` (npm, pinned in package.json): an
Amazon States Language checker this project did not write. It reports what moto and cfn-lint accept and the
service refuses at CREATE, e.g. a state name used twice (ASL specification, "States": names MUST be unique
within the whole state machine, Map item processors and Parallel branches included).

The `${Name}` placeholders CloudFormation fills from DefinitionSubstitutions are stood in by values shaped like
the real ones (ARNs, resource ids, an ECR image URI), so the validator's ARN and path checks see what AWS sees.
"""
import json
import re
import subprocess

import pytest

from cdk_synth import ROOT
from stacks.settings import Settings
from test_synth import VARIANT_ACCOUNTS, VARIANTS

VALIDATOR = ROOT / "node_modules" / ".bin" / "asl-validator"
ACCOUNT = "123456789012"
# One synthesized app per variant that changes a definition: runtimes (the strategies' request states),
# az_count (subnets), region, name prefix, spot and raw data prefixes.
DEFINITION_VARIANTS = dict(VARIANTS, **{
    "one-runtime": Settings(runtimes=("tfcurrent",), raw_data_prefixes=("s3://corpora/pile/",)),
})


def stand_in(name, region):
    """A value shaped like the one CloudFormation substitutes for placeholder `name`."""
    shapes = {
        "ExecutionRoleArn": "arn:aws:iam::%s:role/lmstack-PermissionsExecutionRole-0A1B2C3D4E5F" % ACCOUNT,
        "ArtifactBucket": "lmstack-storageartifacts-0a1b2c3d4e5f",
        "FileSystemId": "fs-0123456789abcdef0",
        "EndpointRoleArn": "arn:aws:iam::%s:role/lmstack-PermissionsEndpointRole-0A1B2C3D4E5F" % ACCOUNT,
        "SecurityGroupId": "sg-0123456789abcdef0",
        "HostingSecurityGroupId": "sg-0fedcba9876543210",
        "TopicArn": "arn:aws:sns:%s:%s:lmstack-NotificationsTopic-0A1B2C3D4E5F" % (region, ACCOUNT),
        # A published version: the function's ARN with the version number (AWS::Lambda::Version Ref).
        "GateFunctionArn": "arn:aws:lambda:%s:%s:function:lmstack-GateFunction0A1B2C3D-4E5F6G7H8I9J:1" % (
            region, ACCOUNT),
    }
    if name in shapes:
        return shapes[name]
    if re.fullmatch(r"Subnet\d+", name):
        return "subnet-0123456789abcdef%s" % name[len("Subnet"):]
    if name.startswith("Image_"):
        return "%s.dkr.ecr.%s.amazonaws.com/cdk-hnb659fds-container-assets-%s-%s:%s" % (
            ACCOUNT, region, ACCOUNT, region, "0a1b2c3d" * 8)
    raise KeyError("no stand-in for placeholder ${%s}: add one shaped like its CloudFormation value" % name)


def deployed_definitions(synth):
    """{logical id: the definition as CloudFormation would create it} of every state machine in the template."""
    definitions = {}
    for key, machine in synth.resources("AWS::StepFunctions::StateMachine").items():
        properties = machine["Properties"]
        text = properties["DefinitionString"]
        assert isinstance(text, str), "%s: the definition is not one plain string: %r" % (key, text)
        for name in properties.get("DefinitionSubstitutions", {}):
            value = json.dumps(stand_in(name, synth.settings.region))[1:-1]
            text = text.replace("${%s}" % name, value)
        left = sorted(set(re.findall(r"\$\{([A-Za-z0-9_]+)\}", text)))
        assert not left, "%s: placeholders without a substitution: %s" % (key, left)
        definitions[key] = text
    return definitions


def validator_findings(definitions, directory):
    """asl-validator's report on the named definitions; empty when every one is valid."""
    arguments = []
    for key, text in sorted(definitions.items()):
        path = directory / ("%s.asl.json" % key)
        path.write_text(text)
        arguments += ["--json-path", str(path)]
    result = subprocess.run([str(VALIDATOR)] + arguments, capture_output=True, text=True, timeout=120)
    findings = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and not line.startswith("\u2713")]  # a check mark: a valid definition
    assert findings or result.returncode == 0, result
    return findings


@pytest.mark.parametrize("variant", sorted(DEFINITION_VARIANTS))
def test_every_synthesized_definition_passes_asl_validator(synth_app, variant, tmp_path):
    definitions = deployed_definitions(synth_app(DEFINITION_VARIANTS[variant], **VARIANT_ACCOUNTS.get(variant, {})))
    assert len(definitions) == 2  # the training machine and the stop machine
    assert validator_findings(definitions, tmp_path) == []


def test_asl_validator_reports_a_duplicate_state_name(default, tmp_path):
    """The check can fail: a copy of the stop machine whose Map item processor has a state named like the
    machine's first state."""
    key, text = next((key, text) for key, text in deployed_definitions(default).items() if "StopMachine" in key)
    definition = json.loads(text)
    item_processor = next(state["ItemProcessor"] for state in definition["States"].values() if state["Type"] == "Map")
    item_processor["States"][definition["StartAt"]] = {"Type": "Pass", "End": True}
    findings = validator_findings({key: json.dumps(definition)}, tmp_path)
    assert any("DUPLICATE_STATE_NAME" in finding and definition["StartAt"] in finding for finding in findings), \
        findings
