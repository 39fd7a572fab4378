"""Made-up AWS Price Lists (`lmstack.local_pricing`) and boto3 clients they answer, for the gate's price tests.

Each request a client sends is validated by botocore against its `pricing` model before the stand-in sees it, and
each answer is parsed by botocore; no service is reached.
"""
import functools

from controlplane import aws_clients, gate
from lmstack.local_pricing import PriceList, Product
from quota_tables import answered_by


def clients(price_list, region="us-east-1", others=None):
    """A factory of boto3 clients (`controlplane.gate.Context.clients`): Pricing's answered by `price_list`, the
    other services' by `others` (a factory, such as `quota_tables.clients(table)`), else plain clients."""
    import boto3

    session = boto3.session.Session(region_name=region, aws_access_key_id="test", aws_secret_access_key="test")

    @functools.lru_cache(maxsize=None)
    def client(service, region_name=None):
        if service == "pricing":  # configured as the gate's clients are (controlplane.gate.aws_client)
            return answered_by(price_list, session.client(service, region_name=region_name, config=aws_clients.config(
                gate.AWS_CALL_SECONDS)))
        return others(service, region_name=region_name) if others else session.client(service, region_name=region_name)
    return client


def training(prices, region="us-east-1", effective_date="2026-11-01"):
    """A PriceList with a Training product at each {instance_type: usd} of `prices` in `region`."""
    return PriceList([Product(name, "Training", region, usd, effective_date) for name, usd in prices.items()])
