"""What SageMaker charges for the instance types lmstack trains on: a table of records, data of the
control plane.

One record per type of `lm.spec.hardware.INSTANCES` (the types the planner and the input accept;
tests/plan/test_prices.py holds the table to that list): the SageMaker training on-demand price per
instance-hour in its region (PRICE_REGION for every record), where that figure was read and when. It is the
fallback and the offline data of `controlplane.pricing`, which reads the AWS Price List when the gate decides. A type whose price no reachable
source gave has `usd_per_hour` None, and its record says where it was looked for: the planner then
reports no cost for it rather than a guess (`python -m lmstack.plan --usd-per-instance-hour` gives a
training plan's price). docs/execution.md ("What a run costs") says how to refresh a record.

Spot is not in the table: what managed spot saves varies by type, zone and hour (AWS says "up to
90 %"), so `spot_cost` is an estimate under the stated SPOT_DISCOUNT assumption, and says so (SPOT_BASIS).

Python objects rather than a data file, as `controlplane.presets`: pure Python, no TensorFlow.
"""
import collections
import dataclasses
import re
from typing import Optional

PRICE_REGION = "us-east-1"
# Where a figure may come from: AWS's own pricing page or its Price List (the Query API's GetProducts
# or the bulk offer file of service AmazonSageMaker). Figures in third-party code and blogs disagree
# with one another and name no source.
AWS_SOURCES = ("aws.amazon.com/sagemaker/pricing", "AWS Price List")


@dataclasses.dataclass(frozen=True)
class Price:
    """One instance type's SageMaker training price, on demand, in `region`."""

    instance_type: str
    usd_per_hour: Optional[float]  # None: no source reachable gave one (`source` says where it was looked for)
    source: str  # where the figure was read, or where it was looked for without success
    read: str  # when the source was read: YYYY-MM or YYYY-MM-DD
    region: str = PRICE_REGION  # the region whose price the figure is

    def __post_init__(self):
        if self.usd_per_hour is not None and not self.usd_per_hour > 0:
            raise ValueError("prices: %s: usd_per_hour must be a positive number or None, got %r"
                             % (self.instance_type, self.usd_per_hour))
        if not self.source.strip():
            raise ValueError("prices: %s: a price needs its source" % self.instance_type)
        if self.usd_per_hour is not None and not any(origin in self.source for origin in AWS_SOURCES):
            raise ValueError("prices: %s: a figure comes from AWS (its source names one of: %s), not a third party"
                             % (self.instance_type, ", ".join(AWS_SOURCES)))
        if not re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?", self.read):
            raise ValueError("prices: %s: read must be the date the source was read, YYYY-MM or YYYY-MM-DD, "
                             "got %r" % (self.instance_type, self.read))


# The SageMaker pricing page, "On-Demand Pricing", tab "Training", region US East (N. Virginia):
# the figures of the table as first written (2024-06).
PRICING_PAGE = ("Amazon SageMaker pricing page, On-Demand Pricing, Training, US East (N. Virginia): "
                "https://aws.amazon.com/sagemaker/pricing/")
# Where the types added in 2026-12 were looked for, without a figure found: the pricing page fills its
# tables from a script (the stored copies reachable without an account carry no figures); AWS's
# documentation and AWS's sample repositories publish no SageMaker training price for them; the figures
# found in third-party code name no source and disagree with one another, so none is used.
NOT_FOUND = ("not found: the SageMaker pricing page's tables (filled by script; no stored copy reachable here "
             "carries figures), AWS documentation and AWS sample repositories; third-party figures not used. "
             "Refresh from the AWS Price List (docs/execution.md, Refreshing a price)")

TABLE = (
    Price("ml.m5.xlarge", 0.23, PRICING_PAGE, "2024-06"),
    Price("ml.m5.4xlarge", 0.922, PRICING_PAGE, "2024-06"),
    Price("ml.c5.18xlarge", 3.672, PRICING_PAGE, "2024-06"),
    Price("ml.g4dn.12xlarge", 4.89, PRICING_PAGE, "2024-06"),
    Price("ml.g5.xlarge", 1.408, PRICING_PAGE, "2024-06"),
    Price("ml.g5.2xlarge", 1.515, PRICING_PAGE, "2024-06"),
    Price("ml.g5.12xlarge", 7.09, PRICING_PAGE, "2024-06"),
    Price("ml.g5.24xlarge", 10.18, PRICING_PAGE, "2024-06"),
    Price("ml.g5.48xlarge", 20.36, PRICING_PAGE, "2024-06"),
    Price("ml.p3.2xlarge", 3.825, PRICING_PAGE, "2024-06"),
    Price("ml.p3.8xlarge", 14.688, PRICING_PAGE, "2024-06"),
    Price("ml.p3.16xlarge", 28.152, PRICING_PAGE, "2024-06"),
    Price("ml.p3dn.24xlarge", 35.894, PRICING_PAGE, "2024-06"),
    Price("ml.p4d.24xlarge", 37.688, PRICING_PAGE, "2024-06"),
    Price("ml.p4de.24xlarge", 47.11, PRICING_PAGE, "2024-06"),
    Price("ml.p5.48xlarge", 113.068, PRICING_PAGE, "2024-06"),
    Price("ml.p5.4xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.p5e.48xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.p5en.48xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.p6-b200.48xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6.xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6.2xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6.4xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6.8xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6.16xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6.12xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6.24xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6.48xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6e.xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6e.2xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6e.4xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6e.8xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6e.16xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6e.12xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6e.24xlarge", None, NOT_FOUND, "2026-12-06"),
    Price("ml.g6e.48xlarge", None, NOT_FOUND, "2026-12-06"),
)
RECORDS = collections.OrderedDict((record.instance_type, record) for record in TABLE)
if len(RECORDS) != len(TABLE):
    raise ValueError("prices: an instance type has more than one record")

# The figures alone, and the types without one.
ON_DEMAND_USD_PER_HOUR = collections.OrderedDict(
    (name, record.usd_per_hour) for name, record in RECORDS.items() if record.usd_per_hour is not None)
UNPRICED = tuple(name for name, record in RECORDS.items() if record.usd_per_hour is None)

# Managed spot training: AWS advertises "up to 90 %" savings; spot GPU capacity typically
# saves far less. Assumption: spot costs 30 % of on-demand (a 70 % saving), and the
# interruptions it brings cost no extra time (checkpoints restore on the next instance).
SPOT_DISCOUNT = 0.70
SPOT_BASIS = "an estimate at %d %% of on demand (an assumed %d %% saving; the real one varies by type, zone and hour)" % (
    round(100 * (1 - SPOT_DISCOUNT)), round(100 * SPOT_DISCOUNT))


def on_demand_price(instance_type):
    """USD per instance-hour, or None for a type whose price no source gave (UNPRICED)."""
    if instance_type in ON_DEMAND_USD_PER_HOUR:
        return ON_DEMAND_USD_PER_HOUR[instance_type]
    if instance_type in UNPRICED:
        return None
    raise ValueError("no price record for instance type %r; recorded: %s" % (instance_type, ", ".join(RECORDS)))


def price_date(instance_type):
    """When the price of `instance_type` was read (or looked for in vain); None for a type without a record."""
    record = RECORDS.get(instance_type)
    return record.read if record else None


def spot_cost(on_demand_usd):
    """What an on-demand cost becomes with managed spot: an estimate, under the SPOT_DISCOUNT assumption."""
    return None if on_demand_usd is None else on_demand_usd * (1.0 - SPOT_DISCOUNT)
