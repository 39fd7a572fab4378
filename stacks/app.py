"""Build the CDK app: settings from context, the stack, cdk-nag on everything."""
from typing import Optional

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from stacks.config import Settings
from stacks.lmstack_stack import LmStack


def build_app(settings: Optional[Settings] = None, *, app: Optional[cdk.App] = None, nag: bool = True) -> cdk.App:
    """The app with its one stack; `settings` defaults to the app's context (cdk.json and `-c`)."""
    app = app or cdk.App()
    settings = settings or Settings.from_context(app.node.get_all_context())
    # The account stays the deploying credentials' one; the region is fixed so the images and the
    # endpoints are chosen at synth, without a lookup.
    LmStack(app, settings.name_prefix, settings=settings, env=cdk.Environment(region=settings.region),
            description="lmstack: distributed GPT training on SageMaker, orchestrated by Step Functions")
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app
