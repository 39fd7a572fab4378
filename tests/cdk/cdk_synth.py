"""Synthesize the app offline for the tests and read what comes out."""
import json
import pathlib

import aws_cdk as cdk
from aws_cdk.assertions import Template

from stacks.app import build_app

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cdk_json_context():
    return json.loads((ROOT / "cdk.json").read_text())["context"]


def zone_lookup_context(account, region, zones):
    """The cdk.context.json entry the CDK CLI writes after looking up an account's zones: the stubbed lookup."""
    return {"availability-zones:account=%s:region=%s" % (account, region): list(zones)}


def staged_file(outdir, assets_file, object_key):
    """The assembly's file of the file asset published under `object_key` (the assets manifest)."""
    assets = json.loads((outdir / assets_file).read_text())["files"]
    for asset in assets.values():
        if any(destination["objectKey"] == object_key for destination in asset["destinations"].values()):
            return outdir / asset["source"]["path"]
    raise KeyError("no file asset is published as %s" % object_key)


def inline_definitions(template, outdir, assets_file):
    """The template with each state machine's DefinitionS3Location replaced by the staged file's text as
    DefinitionString: what CloudFormation's handler creates (it reads the object, then fills the
    DefinitionSubstitutions as for an inline definition), and the form cfn-lint validates the ASL in."""
    inlined = json.loads(json.dumps(template))
    for resource in inlined["Resources"].values():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::StepFunctions::StateMachine" and "DefinitionS3Location" in properties:
            location = properties.pop("DefinitionS3Location")
            properties["DefinitionString"] = staged_file(outdir, assets_file, location["Key"]).read_text()
    return inlined


class Synth:
    """One synthesized app: the stack's template as a dict (`deployed`, as synthesized; `template`, with the
    state machine definitions read back in from their files, see `inline_definitions`), the assertions
    Template (of `template`), the assembly dir. `account` and `zones`: a deploying account whose zone
    lookup answers `zones` (None: no account)."""

    def __init__(self, settings, outdir, *, nag=True, validation=False, account=None, zones=None):
        context = cdk_json_context()
        if zones is not None:
            context.update(zone_lookup_context(account, settings.region, zones))
        app = cdk.App(outdir=str(outdir), context=context, builtin_cloud_formation_validation=validation)
        build_app(settings, app=app, nag=nag, account=account)
        self.assembly = app.synth()
        # The settings the stack resolved (az_count from the zones).
        self.settings = app.node.find_child(settings.name_prefix).settings
        manifest = json.loads((pathlib.Path(self.assembly.directory) / "manifest.json").read_text())
        self.missing_context = [missing["key"] for missing in manifest.get("missing", [])]
        artifact = self.assembly.get_stack_by_name(settings.name_prefix)
        self.outdir = pathlib.Path(self.assembly.directory)
        self.deployed = artifact.template
        self.deployed_path = self.outdir / artifact.template_file
        # The stack's asset manifest: the CDK names it after the stack's artifact.
        self.template = inline_definitions(self.deployed, self.outdir, "%s.assets.json" % artifact.id)
        self.template_path = self.outdir / ("%s.inlined.json" % artifact.stack_name)
        self.template_path.write_text(json.dumps(self.template, indent=1))

    @property
    def assertions(self):
        return Template.from_json(self.template)

    def resources(self, type_name):
        return {key: value for key, value in self.template["Resources"].items() if value["Type"] == type_name}

    def only(self, type_name):
        found = self.resources(type_name)
        assert len(found) == 1, "expected one %s, found %s" % (type_name, sorted(found))
        return next(iter(found.items()))
