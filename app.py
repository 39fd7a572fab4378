#!/usr/bin/env python3
"""lmstack's CDK app (`npx cdk synth`, `npx cdk deploy`); settings: cdk.json context `lmstack`, `-c lmstack:<key>=<value>`."""
import os

from stacks.app import build_app

if __name__ == "__main__":
    # Set by the CDK CLI from the credentials it found; unset offline (an account-agnostic template).
    build_app(account=os.environ.get("CDK_DEFAULT_ACCOUNT")).synth()
