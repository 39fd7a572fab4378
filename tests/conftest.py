import os

import module_order

# Never reach AWS: fake credentials and a fixed region for boto3, moto and the CDK.
os.environ.update({
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
})

# The moto deployment fixtures (engine, waits, jobs, make_deployment, deployment), shared by
# tests/state_machine and tests/test_job_sdk.py.
pytest_plugins = ["state_machine.harness"]


def pytest_collection_modifyitems(items):
    """The longest modules first, for the two xdist workers (tests/module_order.py)."""
    items[:] = module_order.longest_first(items)
