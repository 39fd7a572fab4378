"""Service Quotas tables of made-up accounts, for `lmstack.local_service_quotas` (the stand-in the gate's Lambda
worker, `lmstack.start` and the gate's own tests are answered by).

Each quota is checked against botocore's service-quotas model (shape `ServiceQuota`: its members and their
types) before a test uses it, so the answers are shaped as the service's. The names are SageMaker's quota
names as Service Quotas lists them (`controlplane.quotas`), for every type the input accepts, plus quotas of
other SageMaker features that a lookup must skip; codes are made up (`L-` and 8 hex digits, as AWS's).
"""
import hashlib

import botocore.session
import botocore.validate

from controlplane import aws_clients, gate, quotas
from lm.spec.hardware import INSTANCES
from controlplane.containers import HOSTING_INSTANCE_TYPES
from lmstack.local_pricing import PriceList
from lmstack.local_service_quotas import Quota, ServiceQuotas

_MODEL = botocore.session.get_session().get_service_model("service-quotas")
PER_TYPE = (quotas.TRAINING, quotas.SPOT_TRAINING, quotas.WARM_POOL)
# Quotas of other SageMaker features (the real listing has hundreds): a lookup reads past them.
OTHERS = ("{} for notebook instance usage", "{} for processing job usage", "{} for transform job usage")
ACCOUNT_WIDE = (quotas.PER_TRAINING_JOB, quotas.ALL_TRAINING_JOBS, quotas.ALL_SPOT_TRAINING_JOBS)


def code(name):
    return "L-" + hashlib.md5(name.encode()).hexdigest()[:8].upper()


def names():
    """Every SageMaker quota name of the made-up accounts."""
    found = [template.format(instance_type) for instance_type in INSTANCES for template in PER_TYPE + OTHERS]
    found += [quotas.ENDPOINT.format(instance_type) for instance_type in HOSTING_INSTANCE_TYPES]
    return found + list(ACCOUNT_WIDE)


def checked(quota):
    """`quota` after botocore's validation of its answer shapes (ServiceQuota; an ErrorReason's ErrorCode one of
    the model's enum, which the validator does not check)."""
    for shape in (quota.shape(quota.default), quota.applied_shape()):
        if shape is not None:
            report = botocore.validate.ParamValidator().validate(shape, _MODEL.shape_for("ServiceQuota"))
            if report.has_errors():
                raise ValueError(report.generate_report())
    if quota.error is not None and quota.error[0] not in _MODEL.shape_for("ErrorReason").members["ErrorCode"].enum:
        raise ValueError("ErrorCode %r is not one of the model's" % quota.error[0])
    return quota


def account(values=None, default=1000.0, defaults_only=(), errors=None, errors_of=None):
    """The Service Quotas of an account where every SageMaker quota is `default` (instances), except `values`
    {name: value}; the names in `defaults_only` have no applied value (ListServiceQuotas leaves them out), those
    of `errors_of` {name: (ErrorCode, ErrorMessage)} an ErrorReason instead; `errors` {operation: (code,
    message)} fail every such request."""
    values, errors_of = dict(values or {}), dict(errors_of or {})
    unknown = (set(values) | set(errors_of)) - set(names())
    if unknown:
        raise ValueError("no such quota in the made-up account: %s" % ", ".join(sorted(unknown)))
    table = []
    for name in names():
        value = float(values.get(name, default))
        table.append(checked(Quota("sagemaker", code(name), name, value, None if name in defaults_only else value,
                                   error=errors_of.get(name))))
    return ServiceQuotas(table, errors)


def answered_by(table, client):
    """`client` (a boto3 client) answered by `table` (a ServiceQuotas, or a local_pricing.PriceList). botocore calls every before-send handler,
    and moto's stub, which every session gets while moto is imported, refuses ListServiceQuotas
    (NotImplementedError) under an active mock: it is taken off this client."""
    from moto.core.models import botocore_stubber

    client.meta.events.unregister("before-send", botocore_stubber)
    table.register(client.meta.events)
    return client


class Session:
    """A boto3 session (under moto where a mock is active) whose Service Quotas clients `table` answers, and its
    Pricing clients `price_list` (`lmstack.local_pricing`; default one that cannot be reached)."""

    def __init__(self, table, region="us-east-1", price_list=None, **credentials):
        import boto3

        self.table = table
        self.price_list = price_list or PriceList(reachable=False)
        self.boto = boto3.session.Session(region_name=region, **credentials)
        self.region_name = region

    def client(self, service, **options):
        if service == "pricing":  # default no network: the gate's price lookups fall back to the table
            # configured as the gate's clients are (controlplane.gate.aws_client: bounded, standard retries)
            options.setdefault("config", aws_clients.config(gate.AWS_CALL_SECONDS))
            return answered_by(self.price_list, self.boto.client(service, **options))
        client = self.boto.client(service, **options)
        return answered_by(self.table, client) if service == "service-quotas" else client


def clients(table):
    """A factory of real boto3 clients (`controlplane.gate.Context.clients`), one per service, whose Service
    Quotas requests `table` answers: botocore validates each request and parses each answer; no service is
    reached."""
    import functools

    return functools.lru_cache(maxsize=None)(Session(table, aws_access_key_id="test", aws_secret_access_key="test").client)
