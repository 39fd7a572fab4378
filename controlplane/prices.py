"""What SageMaker charges for the instance types the planner prices.

Every number here is a published figure or a stated assumption; change it here and
nowhere else. Pure Python, no TensorFlow.
"""

# SageMaker Training on-demand price per instance-hour, region us-east-1, USD, from the
# Amazon SageMaker pricing page ("Training" tab), as of 2024-06. Re-checked 2026-12 for the
# instance types added then (P5 4xlarge, P5e, P5en, P6-B200, G6, G6e): the pricing page could
# not be reached from where this table is kept, and no copy of its SageMaker rows was found, so
# those types carry no price here (UNPRICED): the planner then reports no cost for them unless
# a training plan's price is given (`controlplane.planner --usd-per-instance-hour`). Check the page before
# you budget a large run.
PRICE_REGION = "us-east-1"
PRICE_DATE = "2024-06"
ON_DEMAND_USD_PER_HOUR = {
    "ml.m5.xlarge": 0.23,
    "ml.m5.4xlarge": 0.922,
    "ml.c5.18xlarge": 3.672,
    "ml.g4dn.12xlarge": 4.89,
    "ml.g5.xlarge": 1.408,
    "ml.g5.2xlarge": 1.515,
    "ml.g5.12xlarge": 7.09,
    "ml.g5.24xlarge": 10.18,
    "ml.g5.48xlarge": 20.36,
    "ml.p3.2xlarge": 3.825,
    "ml.p3.8xlarge": 14.688,
    "ml.p3.16xlarge": 28.152,
    "ml.p3dn.24xlarge": 35.894,
    "ml.p4d.24xlarge": 37.688,
    "ml.p4de.24xlarge": 47.11,
    "ml.p5.48xlarge": 113.068,
}

# Managed spot training: AWS advertises "up to 90 %" savings; spot GPU capacity typically
# saves far less. Assumption: spot costs 30 % of on-demand (a 70 % saving), and the
# interruptions it brings cost no extra time (checkpoints restore on the next instance).
SPOT_DISCOUNT = 0.70

# Instance types lmstack trains on whose SageMaker price could not be sourced (see above).
UNPRICED = ("ml.p5.4xlarge", "ml.p5e.48xlarge", "ml.p5en.48xlarge", "ml.p6-b200.48xlarge",
            "ml.g6.xlarge", "ml.g6.2xlarge", "ml.g6.4xlarge", "ml.g6.8xlarge", "ml.g6.16xlarge",
            "ml.g6.12xlarge", "ml.g6.24xlarge", "ml.g6.48xlarge",
            "ml.g6e.xlarge", "ml.g6e.2xlarge", "ml.g6e.4xlarge", "ml.g6e.8xlarge", "ml.g6e.16xlarge",
            "ml.g6e.12xlarge", "ml.g6e.24xlarge", "ml.g6e.48xlarge")


def on_demand_price(instance_type):
    """USD per instance-hour, or None for an instance type in UNPRICED."""
    if instance_type in UNPRICED:
        return None
    try:
        return ON_DEMAND_USD_PER_HOUR[instance_type]
    except KeyError:
        raise ValueError("no price for instance type %r; priced: %s" % (
            instance_type, ", ".join(ON_DEMAND_USD_PER_HOUR)))


def spot_cost(on_demand_usd):
    """What an on-demand cost becomes with managed spot, under the SPOT_DISCOUNT assumption."""
    return None if on_demand_usd is None else on_demand_usd * (1.0 - SPOT_DISCOUNT)
