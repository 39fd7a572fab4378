#!/usr/bin/env python3
"""lmstack's CDK app (`npx cdk synth`, `npx cdk deploy`); settings: cdk.json context `lmstack`, `-c lmstack:<key>=<value>`."""
from stacks.app import build_app

if __name__ == "__main__":
    build_app().synth()
