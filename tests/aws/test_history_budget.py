"""Execution history budget (Step Functions quotas: 25,000 events per Standard execution; the execution
fails once it is reached) of a spot training job that runs 12 days of wall clock and that SageMaker interrupts
100 times (Managed Spot Training: each interruption shows as SecondaryStatus Interrupted, then Starting,
Downloading, Training again). Measured on moto's engine with the shipped definition, then extrapolated;
nothing is hard-coded but the quota. With the monitor polling at most every 15 minutes a steady poll costs
about 864 events a day, so 12 days is what fits with that many interruptions (docs/limits.md)."""
from state_machine.harness import SUCCESS

from controlplane import history

HISTORY_QUOTA = 25000
DAYS = 12
INTERRUPTIONS = 100
# The waits the poll takes to grow from POLL_MIN_SECONDS to POLL_MAX_SECONDS, doubling (the last one capped).
RAMP_POLLS = (-(-history.POLL_MAX_FLOOR // history.POLL_MIN_SECONDS) - 1).bit_length() + 1
STEADY_POLLS = RAMP_POLLS + 3
INTERRUPTION = [("InProgress", "Interrupted", {}), ("InProgress", "Starting", {}),
                ("InProgress", "Downloading", {})] + [("InProgress", "Training", {})] * STEADY_POLLS


def _events(deployment, interruptions):
    script = SUCCESS[:3] + [("InProgress", "Training", {})] * STEADY_POLLS + INTERRUPTION * interruptions \
        + SUCCESS[-2:]
    deployment.jobs.scripts.append(script)
    run = deployment.run({}, name="interrupted-%d" % interruptions)
    assert run.status == "SUCCEEDED", (run.description.get("error"), run.description.get("cause"))
    return run.events


def test_12_day_job_with_100_spot_interruptions_stays_under_the_history_quota(deployment):
    once, twice = _events(deployment, 1), _events(deployment, 2)
    waits = [index for index, event in enumerate(once) if event["type"] == "WaitStateEntered"]
    # A steady poll at the maximum wait is the cheapest iteration (no phase notification, no backoff step).
    per_steady_poll = min(later - earlier for earlier, later in zip(waits, waits[1:]))
    # One more cycle, less its polls at the maximum wait (those are steady time, counted below).
    per_interruption = len(twice) - len(once) - (STEADY_POLLS - RAMP_POLLS) * per_steady_poll
    steady_polls = DAYS * 86400 // history.POLL_MAX_FLOOR + 1
    total = len(once) + steady_polls * per_steady_poll + (INTERRUPTIONS - 1) * per_interruption
    assert per_interruption > per_steady_poll  # the status changes and the poll ramp are counted
    # 10 % margin: the quota is hard (the execution fails at it); measured ~21,500 (see the report line).
    assert total < HISTORY_QUOTA * 0.9, dict(total=total, per_interruption=per_interruption,
                                           per_steady_poll=per_steady_poll)
    print("history events: %d of %d (per interruption %d, per steady poll %d)" % (
        total, HISTORY_QUOTA, per_interruption, per_steady_poll))
