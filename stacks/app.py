"""Build the CDK app: settings from context, the stack, cdk-nag on everything."""
from typing import Optional

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from stacks.settings import Settings
from stacks.lmstack_stack import LmStack


def build_app(settings: Optional[Settings] = None, *, app: Optional[cdk.App] = None, nag: bool = True,
              account: Optional[str] = None) -> cdk.App:
    """The app with its one stack; `settings` defaults to the app's context (cdk.json and `-c`).
    `account`: the deploying account when known (the CDK CLI's CDK_DEFAULT_ACCOUNT): the subnets'
    zones are then looked up at synth (`stacks.network.zones`); None makes an account-agnostic template."""
    app = app or cdk.App()
    settings = settings or Settings.from_context(app.node.get_all_context())
    # The region is fixed so the images and the endpoints are chosen at synth; the account, when
    # known, lets the CDK look up its Availability Zones.
    LmStack(app, settings.name_prefix, settings=settings, env=cdk.Environment(account=account, region=settings.region),
            description="lmstack: distributed GPT training on SageMaker, orchestrated by Step Functions")
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app
