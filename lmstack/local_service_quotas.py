"""A stand-in of AWS Service Quotas: the quota table of one account and region, answered at the AWS SDK's
HTTP layer, so botocore itself serializes and validates every request and parses every answer and error.

moto cannot stand in here: it answers Service Quotas only for service `vpc` and has no ListServiceQuotas.
`ServiceQuotas(quotas)` is a botocore `before-send` handler (the hook moto's own mock uses): it answers the
read operations of the Service Quotas API (API reference 2019-06-24) from its table, in the service's JSON
protocol, and refuses any other request:

- ListServiceQuotas(ServiceCode, MaxResults, NextToken): the quotas of the service whose applied value is
  available ("If the applied quota value is not available for a quota, the quota is not retrieved"), and those
  Service Quotas could not read (`Quota.error`: the entry has an ErrorReason {ErrorCode, ErrorMessage} and no
  Value, as the ServiceQuota shape of botocore's service-quotas model allows), a page at a time: MaxResults 1
  to 100, NextToken only from the page before, none after the last page;
- ListAWSDefaultServiceQuotas(ServiceCode, MaxResults, NextToken): every quota with its default value;
- GetServiceQuota(ServiceCode, QuotaCode): one quota's applied value; NoSuchResourceException without one;
- a ServiceCode that is not in the table: NoSuchResourceException, as for a service the region lacks;
- `errors` {operation: (code, message)}: that operation fails so every time (AccessDeniedException,
  TooManyRequestsException: the errors each operation's model lists); `reachable=False`: no answer at all,
  as without network (botocore's EndpointConnectionError).

Every request is recorded in `calls` as (operation, parameters). The table travels as JSON (`to_json`,
`from_json`): `lmstack.local_lambda` hands it to the function's worker with each invocation, whose SDK
reaches no other service (`unreachable`).

Needs botocore (the Lambda Python runtime ships it; so does this project's environment).
"""
import dataclasses
import json
from typing import Optional

REGION = "us-east-1"
ACCOUNT = "123456789012"
SERVICE_NAMES = {"sagemaker": "Amazon SageMaker"}
MAX_RESULTS = 100  # MaxResults' range is 1-100 (ListServiceQuotas, ListAWSDefaultServiceQuotas)
TARGET_PREFIX = "ServiceQuotasV20190624."  # the X-Amz-Target of the JSON protocol (botocore's targetPrefix)
OPERATIONS = ("ListServiceQuotas", "ListAWSDefaultServiceQuotas", "GetServiceQuota")


@dataclasses.dataclass(frozen=True)
class Quota:
    """One quota of the table. `applied` None: only the default value is available. `error` (ErrorCode,
    ErrorMessage): Service Quotas cannot read the applied value (ErrorReason; ErrorCode one of the model's enum,
    e.g. DEPENDENCY_ACCESS_DENIED_ERROR)."""
    service: str
    code: str
    name: str
    default: float
    applied: Optional[float] = None
    adjustable: bool = True
    error: Optional[tuple] = None

    def shape(self, value):
        """The ServiceQuota structure of the API with `value`, None for an entry with only an ErrorReason
        (botocore's service-quotas model)."""
        shape = {"ServiceCode": self.service, "ServiceName": SERVICE_NAMES.get(self.service, self.service),
                 "QuotaArn": "arn:aws:servicequotas:%s:%s:%s/%s" % (REGION, ACCOUNT, self.service, self.code),
                 "QuotaCode": self.code, "QuotaName": self.name, "Unit": "None",
                 "Adjustable": self.adjustable, "GlobalQuota": False, "QuotaAppliedAtLevel": "ACCOUNT"}
        if value is None:
            shape["ErrorReason"] = {"ErrorCode": self.error[0], "ErrorMessage": self.error[1]}
        else:
            shape["Value"] = float(value)
        return shape

    def applied_shape(self):
        """The entry of ListServiceQuotas and GetServiceQuota, None where they leave the quota out."""
        if self.error is not None:
            return self.shape(None)
        return None if self.applied is None else self.shape(self.applied)


class ServiceQuotas:
    """The table's answers (module docstring); `register(events)` hooks it into a botocore session."""

    def __init__(self, quotas=(), errors=None, reachable=True):
        self.quotas = tuple(quotas)
        self.errors = dict(errors or {})
        self.reachable = reachable  # False: as without network, no request gets an answer
        self.calls = []

    def to_json(self):
        return {"quotas": [dataclasses.asdict(quota) for quota in self.quotas],
                "errors": {operation: list(error) for operation, error in self.errors.items()}}

    @classmethod
    def from_json(cls, value):
        return cls([Quota(**quota) for quota in value["quotas"]], {key: tuple(error) for key, error in
                                                                  value["errors"].items()})

    def register(self, events):
        """Answer the Service Quotas requests of the session whose `events` these are (before other handlers:
        moto's, where it is active)."""
        events.register_first("before-send.service-quotas", self.send)

    def send(self, request, **kwargs):
        """botocore's before-send for Service Quotas: the AWSResponse of the request."""
        from botocore.exceptions import EndpointConnectionError

        if not self.reachable:
            raise EndpointConnectionError(endpoint_url=request.url)
        target = request.headers["X-Amz-Target"]
        operation = (target.decode() if isinstance(target, bytes) else target)[len(TARGET_PREFIX):]
        body = request.body.decode() if isinstance(request.body, bytes) else (request.body or "{}")
        parameters = json.loads(body or "{}")
        self.calls.append((operation, parameters))
        status, answer = self.answer(operation, parameters)
        return _response(request.url, status, answer)

    def answer(self, operation, parameters):
        """(HTTP status, JSON body) of one request."""
        if operation in self.errors:
            code, message = self.errors[operation]
            return _error(code, message)
        if operation not in OPERATIONS:
            return _error("AccessDeniedException", "the stand-in answers only %s" % ", ".join(OPERATIONS))
        service = parameters.get("ServiceCode")
        quotas = [quota for quota in self.quotas if quota.service == service]
        if not quotas:
            return _error("NoSuchResourceException", "The request failed because the specified service does not exist.")
        if operation == "GetServiceQuota":
            found = [quota.applied_shape() for quota in quotas if quota.code == parameters.get("QuotaCode")]
            if not found or found[0] is None:
                return _error("NoSuchResourceException", "The request failed because the specified quota does not exist.")
            return 200, {"Quota": found[0]}
        if operation == "ListServiceQuotas":
            listed = [shape for shape in (quota.applied_shape() for quota in quotas) if shape is not None]
        else:
            listed = [quota.shape(quota.default) for quota in quotas]
        return _page(listed, parameters)


def unreachable(request, event_name, **kwargs):
    """botocore's before-send for every other service: no network (the local Lambda worker's SDK). botocore
    calls every before-send handler, so this one leaves Service Quotas' requests to `ServiceQuotas.send`."""
    from botocore.exceptions import EndpointConnectionError

    if not event_name.startswith("before-send.service-quotas."):
        raise EndpointConnectionError(endpoint_url=request.url)


def _page(listed, parameters, key="Quotas", errors=("IllegalArgumentException", "InvalidPaginationTokenException")):
    """(status, answer) of one page of `listed` under `key`: MaxResults 1 to MAX_RESULTS, NextToken only from the
    page before; `errors`: the service's codes for a MaxResults and a NextToken it refuses."""
    size = parameters.get("MaxResults", MAX_RESULTS)
    if not 1 <= size <= MAX_RESULTS:
        return _error(errors[0], "MaxResults must be between 1 and %d" % MAX_RESULTS)
    token = parameters.get("NextToken")
    start = 0
    if token is not None:
        if not token.isdigit() or not 0 < int(token) < len(listed):
            return _error(errors[1], "Invalid NextToken.")
        start = int(token)
    answer = {key: listed[start:start + size]}
    if start + size < len(listed):
        answer["NextToken"] = str(start + size)
    return 200, answer


def _error(code, message):
    """The JSON protocol's error: botocore's parser reads the code from `__type`."""
    return 400, {"__type": code, "message": message}


class _Body:
    """What botocore reads an AWSResponse's body from."""

    def __init__(self, content):
        self.content = content

    def stream(self, **kwargs):
        yield self.content


def _response(url, status, answer):
    from botocore.awsrequest import AWSResponse

    content = json.dumps(answer).encode()
    return AWSResponse(url, status, {"Content-Type": "application/x-amz-json-1.1",
                                     "x-amzn-RequestId": "local-service-quotas"}, _Body(content))
