"""Fixtures for the CDK app tests: jsii kept quiet, one synthesized app per settings, cached."""
import os
import subprocess

import pytest

from lmstack.demo_run import cdk_environment


def _node_major():
    try:
        return subprocess.run(["node", "-p", "process.versions.node.split('.')[0]"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# Before the first `import aws_cdk` (which starts the jsii Node process): as the Makefile does.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", _node_major())
for _name, _value in cdk_environment().items():
    os.environ.setdefault(_name, _value)

from cdk_synth import Synth  # noqa: E402
from stacks.settings import Settings  # noqa: E402


@pytest.fixture(scope="session")
def synth_app(tmp_path_factory):
    """synth_app(settings, **Synth options such as account and zones) -> Synth, cached per arguments (cdk-nag
    on, the CDK's schema validation off)."""
    cache = {}

    def make(settings=None, **kwargs):
        settings = settings or Settings()
        key = (settings, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = Synth(settings, tmp_path_factory.mktemp("cdk.out"), **kwargs)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def default(synth_app):
    return synth_app()
