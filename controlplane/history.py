"""How often the state machine's job monitor polls, so that the longest run an input allows fits the
execution's history.

A Standard execution holds at most HISTORY_EVENTS events and fails at the limit (Step Functions
service quotas); its stop path then stops the job. The monitor (`stacks.state_machine.jobs`) waits,
describes the job and decides, so every poll writes events: STEADY_POLL_EVENTS while the wait stays
at its cap, RAMP_POLL_EVENTS while it doubles towards the cap, CHANGE_POLL_EVENTS when the job's
SecondaryStatus changed (a notification). The wait starts at POLL_MIN_SECONDS, doubles up to the cap,
and starts over at POLL_MIN_SECONDS on each of the first PHASE_RESETS status changes of a job (later
changes are notified and set the wait to the cap: a spot job interrupted again and again cannot run
the history out).

The cap is the gate's (`poll_cap`): POLL_MAX_FLOOR seconds (15 minutes) where that fits, longer for a
run that may last longer, so that the worst case (every poll after the resets sees a status change)
of every job of the run over its longest wall-clock time (a spot training job: MaxWaitTimeInSeconds,
twice its runtime; a prepare job: its runtime), plus RESERVED_EVENTS for everything that is not a
poll (validation, dataset checks, every capacity attempt of every instance type, deployment), stays
within HISTORY_SHARE of the limit. tests/aws/test_history_budget.py measures the event counts on the
shipped definition and runs the longest run an input allows.

Pure Python, no TensorFlow: shipped in the gate's Lambda function.
"""
import math

HISTORY_EVENTS = 25000
HISTORY_SHARE = 0.7
POLL_MIN_SECONDS = 60
POLL_MAX_FLOOR = 900
PHASE_RESETS = 12
STEADY_POLL_EVENTS = 9
RAMP_POLL_EVENTS = 11
CHANGE_POLL_EVENTS = 16
# Events outside the polls of the long jobs, at most: validation, the dataset and resume checks, every
# capacity attempt (MAX_ATTEMPTS of prepare, MAX_ATTEMPTS on each of 4 instance types of training; about 65
# each), the fallbacks' re-planning and notices, the deployment with its 120 endpoint polls (about 1,800), the
# outputs. Measured at 3,254 (tests/aws/test_history_budget.py).
RESERVED_EVENTS = 3500
# The cap grows by this factor until the worst case fits.
_CAP_GROWTH = 1.25


def ramp_polls(cap_seconds):
    """Polls from POLL_MIN_SECONDS up to the cap: 60, 120, 240, ... then the cap."""
    return max(0, math.ceil(math.log2(cap_seconds / float(POLL_MIN_SECONDS)))) + 1


def worst_events(wall_seconds, cap_seconds):
    """Poll events of one job of `wall_seconds` at most, at the worst: every status change restarts the
    ramp (PHASE_RESETS times), and every poll at the cap sees a change."""
    ramps = (PHASE_RESETS + 1) * ramp_polls(cap_seconds) * CHANGE_POLL_EVENTS
    return ramps + int(math.ceil(wall_seconds / float(cap_seconds))) * CHANGE_POLL_EVENTS


def budget():
    """Events the polls of one execution may write."""
    return int(HISTORY_EVENTS * HISTORY_SHARE) - RESERVED_EVENTS


def poll_cap(job_wall_seconds):
    """The longest wait between two polls of every job of a run whose jobs may last `job_wall_seconds`
    (a list, seconds of wall clock each): POLL_MAX_FLOOR or, where their worst cases would not fit the
    budget at it, the shortest wait (growing by a quarter) at which they do."""
    cap = POLL_MAX_FLOOR
    while sum(worst_events(wall, cap) for wall in job_wall_seconds) > budget():
        cap = int(math.ceil(cap * _CAP_GROWTH))
    return cap
