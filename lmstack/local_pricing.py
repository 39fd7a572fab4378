"""A stand-in of the AWS Price List Query API (`pricing`): SageMaker's on-demand products of a made-up price
list, answered at the AWS SDK's HTTP layer, so botocore itself validates every request against its `pricing`
model (2017-10-15) and parses every answer and error.

moto cannot stand in here: it does not implement Pricing (GetProducts answers 404 "Not yet implemented").
`PriceList(products)` is a botocore `before-send` handler, as `lmstack.local_service_quotas.ServiceQuotas` is for
Service Quotas; it answers GetProducts in the service's JSON protocol (target prefix AWSPriceListService) and
refuses any other request:

- ServiceCode AmazonSageMaker only (another: NotFoundException); Filters of Type TERM_MATCH or EQUALS on
  `ServiceCode` or a product attribute, each product matching all of them (another Type: InvalidParameterException,
  which the stand-in does not implement); MaxResults 1 to 100; NextToken only from the page before;
- each product in the shape of botocore's pricing examples-1.json (GetProducts): a JSON string with product
  {productFamily "ML Instance", attributes, sku}, serviceCode, terms.OnDemand.<sku>.<offerTermCode> with its
  effectiveDate and priceDimensions.<rate code> {unit "Hrs", pricePerUnit {USD}, ...}, version and publicationDate;
  the attributes those SageMaker products carry (`controlplane.pricing`'s docstring says where they were read):
  instanceName, component, regionCode, usagetype (<region prefix>-Train:<type>, -Host:<type>), location, ...;
- `raw`: strings answered as PriceList items besides the products (an answer that cannot be read);
- `errors` {"GetProducts": (code, message)}: every request fails so (ThrottlingException, AccessDeniedException:
  errors the operation's model lists); `reachable=False`: no answer at all, as without network (botocore's
  EndpointConnectionError); `hang()`: every request waits, unanswered, until `release()` (a Price List that does
  not answer: what the caller's own time limit must bound).

Every request is recorded in `calls` as its parameters, with the region of the endpoint it was sent to.
Needs botocore (the Lambda Python runtime ships it; so does this project's environment).
"""
import dataclasses
import hashlib
import json
import threading

from lmstack.local_service_quotas import _error, _response
from lmstack.local_service_quotas import _page as page

SERVICE_CODE = "AmazonSageMaker"
TARGET = "AWSPriceListService.GetProducts"  # the X-Amz-Target of GetProducts (botocore's targetPrefix)
FILTER_TYPES = ("TERM_MATCH", "EQUALS")  # of the model's five, those the stand-in implements
# The usage type's region prefix and the location's name, for the regions the tests use.
REGIONS = {"us-east-1": ("USE1", "US East (N. Virginia)"), "us-west-2": ("USW2", "US West (Oregon)"),
           "eu-west-1": ("EU", "EU (Ireland)"), "eu-central-1": ("EUC1", "EU (Frankfurt)"),
           "ap-south-1": ("APS3", "Asia Pacific (Mumbai)"), "ap-northeast-1": ("APN1", "Asia Pacific (Tokyo)")}
USAGE = {"Training": "Train", "Hosting": "Host"}
OFFER_TERM = "JRTCKXETXF"  # the on-demand offer term code of botocore's example
RATE = "6YS6EN2CT7"


@dataclasses.dataclass(frozen=True)
class Product:
    """One SageMaker product of the made-up price list: an instance type's hourly on-demand price for a component
    in a region, effective from `effective_date` (YYYY-MM-DD)."""
    instance_type: str
    component: str
    region: str
    usd_per_hour: float
    effective_date: str = "2026-11-01"

    @property
    def sku(self):
        return hashlib.md5(repr(dataclasses.astuple(self)).encode()).hexdigest()[:16].upper()

    def attributes(self):
        prefix, location = REGIONS[self.region]
        return {"servicecode": SERVICE_CODE, "servicename": "Amazon SageMaker", "productFamily": "ML Instance",
                "locationType": "AWS Region", "location": location, "regionCode": self.region,
                "instanceName": self.instance_type, "instanceType": "%s-%s" % (self.instance_type, self.component),
                "component": self.component, "operation": "RunInstance",
                "usagetype": "%s-%s:%s" % (prefix, USAGE[self.component], self.instance_type)}

    def item(self):
        """The PriceList item: a JSON string, as GetProducts answers it."""
        sku, term = self.sku, "%s.%s" % (self.sku, OFFER_TERM)
        dimension = {"unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [], "rateCode": term + "." + RATE,
                     "description": "$%g per hour for %s %s in %s" % (self.usd_per_hour, self.component,
                                                                      self.instance_type, self.region),
                     "pricePerUnit": {"USD": "%.10f" % self.usd_per_hour}}
        return json.dumps({
            "product": {"productFamily": "ML Instance", "attributes": self.attributes(), "sku": sku},
            "serviceCode": SERVICE_CODE,
            "terms": {"OnDemand": {term: {"priceDimensions": {term + "." + RATE: dimension}, "sku": sku,
                                          "effectiveDate": self.effective_date + "T00:00:00Z",
                                          "offerTermCode": OFFER_TERM, "termAttributes": {}}}},
            "version": "20261201000000", "publicationDate": "2026-12-01T00:00:00Z"})


class PriceList:
    """The made-up price list's answers (module docstring); `register(events)` hooks it into a botocore session."""

    def __init__(self, products=(), raw=(), errors=None, reachable=True):
        self.products = tuple(products)
        self.raw = tuple(raw)
        self.errors = dict(errors or {})
        self.reachable = reachable
        self.calls = []
        self._answering = threading.Event()
        self._answering.set()

    def hang(self):
        """From now on every request waits, unanswered, until `release`."""
        self._answering.clear()

    def release(self):
        self._answering.set()

    def register(self, events):
        """Answer the Pricing requests of the session whose `events` these are (before moto's handlers)."""
        events.register_first("before-send.pricing", self.send)

    def send(self, request, **kwargs):
        """botocore's before-send for Pricing: the AWSResponse of the request."""
        from botocore.exceptions import EndpointConnectionError

        if not self.reachable:
            raise EndpointConnectionError(endpoint_url=request.url)
        target = request.headers["X-Amz-Target"]
        target = target.decode() if isinstance(target, bytes) else target
        body = request.body.decode() if isinstance(request.body, bytes) else (request.body or "{}")
        parameters = json.loads(body or "{}")
        self.calls.append(dict(parameters, endpoint=request.url))
        self._answering.wait()
        status, answer = self.answer(target, parameters)
        return _response(request.url, status, answer)

    def answer(self, target, parameters):
        """(HTTP status, JSON body) of one request."""
        if "GetProducts" in self.errors:
            return _error(*self.errors["GetProducts"])
        if target != TARGET:
            return _error("AccessDeniedException", "the stand-in answers only %s" % TARGET)
        if parameters.get("ServiceCode") != SERVICE_CODE:
            return _error("NotFoundException", "the stand-in lists only %s" % SERVICE_CODE)
        filters = parameters.get("Filters", [])
        for found in filters:
            if found["Type"] not in FILTER_TYPES:
                return _error("InvalidParameterException", "Filter Type %s: the stand-in implements %s" % (
                    found["Type"], ", ".join(FILTER_TYPES)))
        matching = [product.item() for product in self.products if _matches(product, filters)]
        return _page(matching + list(self.raw), parameters)


def _matches(product, filters):
    values = dict(product.attributes(), ServiceCode=SERVICE_CODE)
    return all(values.get(found["Field"]) == found["Value"] for found in filters)


def _page(items, parameters):
    status, answer = page(items, parameters, "PriceList", ("InvalidParameterException", "InvalidNextTokenException"))
    if status == 200:
        answer["FormatVersion"] = parameters.get("FormatVersion", "aws_v1")
    return status, answer
