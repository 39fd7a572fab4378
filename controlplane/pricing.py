"""What SageMaker charges for an instance type, read when a run is decided: the AWS Price List Query API,
with the table of `controlplane.prices` as the fallback and the offline data.

`price_of(instance_type, component, region, client=None)` is one type's on-demand price per instance-hour for
`component` (TRAINING: training and prepare jobs; HOSTING: the endpoint) in the stack's `region`, as a `Price`
that says where it came from: the Price List, its region and the term's effective date, or the table, its region
and the date its figure was read, with a note saying why the table was used. `prices_of(wanted, region, clients)`
reads several at once within TIME_LIMIT_SECONDS: the gate (a Lambda function with its own timeout,
`stacks.gate_code.TIMEOUT_SECONDS`) must answer whatever the Price List does.

The request (botocore's `pricing` model, 2017-10-15: GetProducts with ServiceCode, Filters of
{Type: TERM_MATCH | EQUALS | CONTAINS | ANY_OF | NONE_OF, Field, Value}, FormatVersion aws_v1, MaxResults):
ServiceCode AmazonSageMaker, TERM_MATCH on the product attributes `regionCode`, `instanceName` and `component`.
The Query API answers in a few regions only (API_REGIONS): the client is made in the nearest of them whatever
the stack's region, which the `regionCode` filter names.

The answer (botocore's pricing examples-1.json, GetProducts: `PriceList` is a list of JSON strings, each
{"product": {"productFamily", "attributes", "sku"}, "terms": {"OnDemand": {"<sku>.<offerTermCode>":
{"effectiveDate", "priceDimensions": {"<rate code>": {"unit", "pricePerUnit": {"USD": "0.1380000000"}, ...}}}}},
"publicationDate", ...}). SageMaker's instance products (offer AmazonSageMaker) are of productFamily "ML Instance",
one per instance type, component and region, with the attributes `component`, `instanceName`, `instanceType`,
`regionCode`, `usagetype`, `location`, ... (AWS's own generator that reads them with GetProducts and a
`regionCode` TERM_MATCH: GitHub cdklabs/cdk-proserve-lib, utilities/generators/lib/
sagemaker-notebook-instance-type.ts at 5e23e0e, lines 10-36 and 84-100). Public reads of the offer of 2026 show
`instanceName` "ml.g5.2xlarge", `component` "Training" or "Hosting", `regionCode` "us-east-1", unit "Hrs", and
usage types `USE1-Train:<type>` and `USE1-Host:<type>` (the AWS Machine Learning Blog's SageMaker spend series
names the same). A training plan's up-front fee (`USE1-TrainingPlanUpfrontFee:<type>`) carries no component, so
the filter leaves it out.

An answer that cannot be read as one hourly price (not JSON, no on-demand term, another unit, several prices) is
a fallback to the table with a note, never a crash. Pure Python; botocore only where a client is passed.
"""
import collections
import concurrent.futures
import dataclasses
import json
from typing import Optional

from controlplane import prices
from controlplane.quotas import describe_error

SERVICE_CODE = "AmazonSageMaker"
TRAINING = "Training"  # the `component` of a training job's instance-hours (the prepare job is one too)
HOSTING = "Hosting"  # the `component` of a real-time endpoint's instance-hours
COMPONENTS = (TRAINING, HOSTING)
# Where the Query API answers (AWS Billing User Guide, "Using the AWS Price List Query API": the endpoints).
API_REGIONS = ("us-east-1", "eu-central-1", "ap-south-1")
PRICE_LIST = "AWS Price List"
FORMAT_VERSION = "aws_v1"
MAX_RESULTS = 100  # one product answers; the page size only bounds a surprise
HOURLY_UNIT = "Hrs"
# All lookups of one decision together: a slow or silent Price List costs the gate at most this, with its quota
# lookup's time (controlplane.gate.QUOTA_SECONDS and one call more) inside its Lambda timeout (60 s). Each
# request is bounded too, by the client's own timeouts (the gate's: controlplane.aws_clients).
TIME_LIMIT_SECONDS = 10.0


class PriceListError(ValueError):
    """An answer of the Price List that cannot be read as one hourly price."""


@dataclasses.dataclass(frozen=True)
class Price:
    """One instance type's on-demand price per instance-hour for `component` in `region`, and where it came from.
    `usd_per_hour` None: no source had one (`source` and `note` say where it was looked for)."""
    instance_type: str
    component: str
    region: str  # the region the figure is for (the table's may differ from the stack's: `note` says so)
    usd_per_hour: Optional[float]
    source: str  # "AWS Price List (...)" or "controlplane.prices (...)"
    effective_date: Optional[str]  # the Price List term's effectiveDate (YYYY-MM-DD), or when the table's was read
    note: str = ""  # why the table was used where the Price List was asked; "" otherwise

    @property
    def from_price_list(self):
        return self.source.startswith(PRICE_LIST)

    def described(self):
        """"$1.515/h (AWS Price List, us-east-1, effective 2026-10-01)", or "no price (...)"."""
        where = ", ".join([self.source.split(" (")[0], self.region] + (["%s %s" % (
            "effective" if self.from_price_list else "read", self.effective_date)] if self.effective_date else []))
        if self.usd_per_hour is None:
            return "no price (%s)" % where
        return "$%g/h (%s)" % (self.usd_per_hour, where)


def api_region(region):
    """The Query API's region nearest the stack's `region`: Europe's, Asia Pacific's, else us-east-1."""
    if region and region.startswith(("eu-", "me-", "il-", "af-")):
        return "eu-central-1"
    if region and region.startswith("ap-"):
        return "ap-south-1"
    return "us-east-1"


def request(instance_type, component, region):
    """The GetProducts parameters for one type's on-demand price for `component` in `region`."""
    if component not in COMPONENTS:
        raise ValueError("component must be one of %s, got %r" % (", ".join(COMPONENTS), component))
    return {"ServiceCode": SERVICE_CODE, "FormatVersion": FORMAT_VERSION, "MaxResults": MAX_RESULTS,
            "Filters": [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in (
                ("regionCode", region), ("instanceName", instance_type), ("component", component))]}


def read_answer(answer, instance_type, component, region):
    """(USD per hour, effective date) of the one product of `answer` for the type, component and region; None
    when it lists none; PriceListError when it cannot be read as one hourly price."""
    wanted = {"instanceName": instance_type, "component": component, "regionCode": region}
    found = {}
    try:
        for item in answer.get("PriceList") or []:
            product = json.loads(item) if isinstance(item, str) else item
            attributes = product["product"]["attributes"]
            if any(attributes.get(name) != value for name, value in wanted.items()):
                continue  # a product the filters should not have let through
            for term in product["terms"]["OnDemand"].values():
                for dimension in term["priceDimensions"].values():
                    if dimension["unit"] != HOURLY_UNIT:
                        raise PriceListError("a price per %r, not per hour (%s)" % (dimension["unit"], HOURLY_UNIT))
                    found[float(dimension["pricePerUnit"]["USD"])] = term["effectiveDate"][:10]
    except PriceListError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise PriceListError("an unreadable answer (%s: %s)" % (type(error).__name__, error))
    if len(found) > 1:
        raise PriceListError("%d different prices (%s)" % (len(found), ", ".join("%g" % usd for usd in sorted(found))))
    if found:
        ((usd, effective),) = found.items()
        if not usd > 0:
            raise PriceListError("a price of %g" % usd)
        return usd, effective
    return None


def from_table(instance_type, component, region, note=""):
    """The table's price (controlplane.prices: training prices, in its PRICE_REGION), labelled as the table's."""
    record = prices.RECORDS.get(instance_type)
    if component != TRAINING or record is None:
        return Price(instance_type, component, prices.PRICE_REGION, None,
                     "controlplane.prices (training prices only, %d types)" % len(prices.RECORDS), None, note)
    if region != record.region:
        note = "; ".join(filter(None, [note, "the table's price is %s's, not %s's" % (record.region, region)]))
    return Price(instance_type, component, record.region, record.usd_per_hour,
                 "controlplane.prices (%s)" % record.source.split(":")[0], record.read, note)


def price_of(instance_type, component, region, *, client=None):
    """The on-demand price of `instance_type` for `component` in `region`: from the Price List when `client` (a
    boto3 `pricing` client) is given and it answers with one price, else the table's, with a note saying why."""
    if client is None:
        return from_table(instance_type, component, region)
    from botocore.exceptions import BotoCoreError, ClientError

    where = "%s in %s" % (component, region)
    try:
        found = read_answer(client.get_products(**request(instance_type, component, region)),
                            instance_type, component, region)
    except (BotoCoreError, ClientError) as error:
        return from_table(instance_type, component, region,
                          "the AWS Price List could not answer (%s)" % describe_error(error))
    except PriceListError as error:
        return from_table(instance_type, component, region,
                          "the AWS Price List's answer for %s %s could not be read: %s" % (instance_type, where, error))
    if found is None:
        return from_table(instance_type, component, region,
                          "the AWS Price List has no on-demand price of %s for %s" % (instance_type, where))
    usd, effective = found
    return Price(instance_type, component, region, usd,
                 "%s (GetProducts, %s, %s, regionCode %s)" % (PRICE_LIST, SERVICE_CODE, component, region), effective)


def prices_of(wanted, region, clients=None, time_limit=None):
    """{(instance_type, component): Price} for each pair of `wanted`, read at once within `time_limit` seconds.
    `clients(service, region_name=...)`: a factory of boto3 clients (a Session's client, the gate's), or None to ask
    no AWS (the table's prices, no note). A lookup still running at the limit (default TIME_LIMIT_SECONDS) is the
    table's, with a note."""
    time_limit = TIME_LIMIT_SECONDS if time_limit is None else time_limit
    wanted = list(dict.fromkeys(wanted))
    if clients is None or not wanted:
        return {pair: from_table(pair[0], pair[1], region) for pair in wanted}
    try:
        from botocore.exceptions import BotoCoreError

        client = clients("pricing", region_name=api_region(region))
    except ImportError:
        return {pair: from_table(pair[0], pair[1], region, "no AWS SDK here to ask the AWS Price List")
                for pair in wanted}
    except BotoCoreError as error:
        return {pair: from_table(pair[0], pair[1], region, "no AWS Price List client (%s)" % describe_error(error))
                for pair in wanted}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(wanted))
    futures = {pair: pool.submit(price_of, pair[0], pair[1], region, client=client) for pair in wanted}
    concurrent.futures.wait(futures.values(), timeout=time_limit)
    pool.shutdown(wait=False, cancel_futures=True)  # a lookup still waiting is left to its own timeouts
    late = "the AWS Price List did not answer within %g s" % time_limit
    found = {}
    for pair, future in futures.items():
        found[pair] = future.result() if future.done() else from_table(pair[0], pair[1], region, late)
    return found



# ---- what the gate makes of the prices ----

def reprice(summary, price, spot):
    """The gate's plan summary of a training launch (`controlplane.gate.plan_summary`) with its costs at `price`,
    the price of its instance type for training (`spot`: the run's cost is the spot estimate), and where that
    price came from."""
    hours, count = summary["hours"], summary["instance_count"]
    on_demand = None if price.usd_per_hour is None or hours is None else hours * count * price.usd_per_hour
    summary.update(usd_per_instance_hour=price.usd_per_hour, cost_on_demand_usd=on_demand,
                   cost_spot_usd=prices.spot_cost(on_demand), price_region=price.region,
                   price_date=price.effective_date, price_source=price.source)
    summary["cost_usd"] = summary["cost_spot_usd"] if spot else on_demand
    return summary


def endpoint_plan(deploy, price):
    """The plan's `endpoint`: its instances, the hourly price of its type for hosting, and where it came from."""
    per_hour = None if price.usd_per_hour is None else price.usd_per_hour * deploy["instance_count"]
    return collections.OrderedDict([
        ("instance_type", deploy["instance_type"]), ("instance_count", deploy["instance_count"]),
        ("usd_per_instance_hour", price.usd_per_hour), ("usd_per_hour", per_hour),
        ("budget_hours", deploy["budget_hours"]),
        ("budget_usd", None if per_hour is None else per_hour * deploy["budget_hours"]),
        ("price_region", price.region), ("price_date", price.effective_date), ("price_source", price.source),
        ("bills", bills(deploy, price, per_hour))])


def bills(deploy, price, per_hour):
    """What the endpoint bills, in the deploy stage's words (its notification when the endpoint is InService)."""
    instances = "%d x %s" % (deploy["instance_count"], deploy["instance_type"])
    if per_hour is None:
        return "%s bills every hour until deleted (%s)" % (instances, price.described())
    return "%s at %s bills $%.2f an hour until deleted" % (instances, price.described(), per_hour)


def note(price):
    """The decision's line about one price: which was used and where it came from (why the table's, if so)."""
    return "price of %s for %s: %s%s" % (
        price.instance_type, price.component.lower(), price.described(),
        "; the table's, as %s" % price.note if price.note else "")
