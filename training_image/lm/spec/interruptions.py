"""How often a job is interrupted, and the checkpoint interval that costs least for it (`checkpoint_every: "auto"`).

Young (1974) and Daly (2006): with a save of `save` seconds and interruptions at random (a Poisson process)
`mtbi` seconds apart on average, the interval of work between saves that minimizes the expected time lost,
saves plus the work redone after each interruption, is about sqrt(2 x save x mtbi) (first order in
save / mtbi); `controlplane.checkpoint_plan` states the expected loss at it.

The mean time between interruptions of a job is the mean of one instance divided by the job's instance
count (any instance lost interrupts the whole job). The defaults per instance, unless the hyperparameter
`interruption_hours` gives one:
- spot: the Spot Instance Advisor's highest band of "frequency of interruption" ("the rate at which Spot has
  reclaimed capacity during the trailing month", in bands < 5 %, 5-10 %, 10-15 %, 15-20 % and > 20 %; AWS,
  the advisor's data at spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json), taken at 20 % a month: one
  interruption per instance per 5 months, SPOT_INSTANCE_HOURS. GPU types are often in that band; where
  interruptions come more often the band says only "more than 20 %": give `interruption_hours`.
- on demand: hardware and software failures. Llama 3's pre-training saw 419 unexpected interruptions in a
  54-day snapshot on up to 16,384 H100 GPUs (Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.4,
  Table 5): one per 50,700 GPU-hours, ON_DEMAND_GPU_HOURS, divided by an instance's GPUs.

Pure Python 3.8, no TensorFlow: the gate plans with it, the job re-plans with it after its first save.
"""
import math

DAYS_PER_MONTH = 365.25 / 12
SPOT_INSTANCE_HOURS = DAYS_PER_MONTH * 24 / 0.20  # 3,653 hours
ON_DEMAND_GPU_HOURS = 54 * 24 * 16384 / 419.0  # 50,676 GPU-hours
AUTO = "auto"


def instance_hours(spot, gpus_per_host):
    """The default mean hours between interruptions of one instance (the module docstring)."""
    return SPOT_INSTANCE_HOURS if spot else ON_DEMAND_GPU_HOURS / max(1, gpus_per_host)


def job_mtbi_seconds(instance_count, spot, gpus_per_host, given_hours=0.0):
    """The mean seconds between interruptions of a job of `instance_count` instances (`given_hours`: the
    hyperparameter interruption_hours per instance, 0 for the default)."""
    hours = given_hours or instance_hours(spot, gpus_per_host)
    return hours * 3600.0 / max(1, instance_count)


def young_daly_seconds(save_seconds, mtbi_seconds):
    """The seconds of work between saves that minimize the expected loss (the module docstring)."""
    return math.sqrt(2.0 * save_seconds * mtbi_seconds)


