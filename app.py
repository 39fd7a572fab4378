#!/usr/bin/env python3
"""lmstack's CDK app (`npx cdk synth`, `npx cdk deploy`); settings: cdk.json context `lmstack`, `-c lmstack:<key>=<value>`."""
import os
import sys

# This checkout's training_image (lm.spec, which the app reads), before any installed copy of it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "training_image"))

from stacks.app import build_app  # noqa: E402

if __name__ == "__main__":
    # Set by the CDK CLI from the credentials it found; unset offline (an account-agnostic template).
    build_app(account=os.environ.get("CDK_DEFAULT_ACCOUNT")).synth()
