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


class Synth:
    """One synthesized app: the stack's template as a dict, the assertions Template, the assembly dir.
    `account` and `zones`: a deploying account whose zone lookup answers `zones` (None: no account)."""

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
        self.template = artifact.template
        self.template_path = pathlib.Path(self.assembly.directory) / artifact.template_file
        self.outdir = pathlib.Path(self.assembly.directory)

    @property
    def assertions(self):
        return Template.from_json(self.template)

    def resources(self, type_name):
        return {key: value for key, value in self.template["Resources"].items() if value["Type"] == type_name}

    def only(self, type_name):
        found = self.resources(type_name)
        assert len(found) == 1, "expected one %s, found %s" % (type_name, sorted(found))
        return next(iter(found.items()))
