"""The longest run an input allows fits 70 % of a Standard execution's history (Step Functions quotas: 25,000
events; the execution fails at the limit and its stop path stops the job).

The longest run: a prepare job of 28 days (MaxRuntimeInSeconds' cap) and a spot training job that may run and
wait 2 x 28 days (MaxWaitTimeInSeconds), whose SecondaryStatus changes at every poll (the worst case of
interruptions), after every capacity attempt of every fallback type failed, then a deployment that polls its
endpoint to the end. moto's engine runs about a hundred events a second, so the run is simulated in two steps:

1. Calibration on moto, with the shipped definition: a scripted job whose status ramps, settles, changes more
   often than the monitor restarts its wait, and completes. The waits the engine asked for are the waits the
   model below computes for the same statuses, and the monitor's events are the model's count with
   `controlplane.history`'s events per poll (steady, ramp, change). A second run measures what is not a poll
   of a long job: the stages, a capacity attempt, a fallback to the next type, an endpoint poll.
2. The simulation: the model over the gate's own plan for the longest input (its poll cap), with the
   calibrated counts, plus every attempt, fallback and endpoint poll the input allows.

A capacity error is taken to end an attempt within its first polls (SageMaker reports CapacityError while it
provisions); a training job that fails for capacity after days and is retried is not covered (docs/limits.md).
"""
import collections

from state_machine.harness import COMPLETED_EXTRA, StandInSettings

from controlplane import gate, history, inputs
from stacks.state_machine import deploy, jobs

LONGEST = inputs.MAX_RUNTIME_SECONDS
FALLBACKS = ["ml.g5.12xlarge", "ml.p3.16xlarge", "ml.p4d.24xlarge"]
LONGEST_INPUT = {"spot": True, "max_runtime_seconds": LONGEST, "fallback_instance_types": FALLBACKS,
                 "prepare": {"enabled": True, "force": True, "max_runtime_seconds": LONGEST},
                 "deploy": {"enabled": True, "instance_type": "ml.g4dn.12xlarge"}}
CAPACITY = [("InProgress", "Starting", {}),
            ("Failed", "Failed", {"FailureReason": "CapacityError: Unable to provision requested ML compute capacity"})]
EVENTS = {"steady": history.STEADY_POLL_EVENTS, "ramp": history.RAMP_POLL_EVENTS,
          "change": history.CHANGE_POLL_EVENTS, "end": history.STEADY_POLL_EVENTS}


def monitor(poll, secondary_at):
    """The shipped monitor's schedule (stacks.state_machine.jobs._monitor_states), as a model: `secondary_at(i,
    elapsed)` is the SecondaryStatus poll i sees, None once the job completed. Returns (waits, poll kinds)."""
    seconds, resets, elapsed, seen, waits, kinds = poll["min_seconds"], 0, 0, "", [], []
    while True:
        waits.append(seconds)
        elapsed += seconds
        secondary = secondary_at(len(kinds), elapsed)
        if secondary is None:
            return waits, kinds + ["end"]
        if secondary != seen:
            kinds.append("change")
            seen = secondary
            if resets < poll["phase_resets"]:
                seconds, resets = poll["min_seconds"], resets + 1
            else:
                seconds = poll["max_seconds"]
        elif seconds >= poll["max_seconds"]:
            kinds.append("steady")
        else:
            kinds.append("ramp")
            seconds = poll["max_seconds"] if seconds > poll["half_max_seconds"] else 2 * seconds


def events_of(kinds):
    return sum(EVENTS[kind] for kind in kinds)


def entered(run, name):
    """History indices at which state `name` was entered."""
    return [index for index, event in enumerate(run.events)
            if event.get("stateEnteredEventDetails", {}).get("name") == name]


# Starting, Downloading, a ramp to the cap, steady polls, then more changes than the monitor restarts for
# (Interrupted and Training in turn), steady again, done.
SCRIPTED = (["Starting", "Downloading"] + ["Training"] * 7
            + ["Interrupted", "Training"] * (history.PHASE_RESETS // 2 + 1) + ["Training"] * 3)


def test_the_monitor_waits_and_writes_what_the_model_counts(deployment, waits):
    deployment.jobs.scripts.append([("InProgress", secondary, {}) for secondary in SCRIPTED]
                                   + [("Completed", "Completed", COMPLETED_EXTRA)])
    run = deployment.run({"hyperparameters": {"max_steps": 5}})
    assert run.status == "SUCCEEDED", run.description.get("cause")
    poll = run.output["plan"]["poll"]
    expected_waits, kinds = monitor(poll, lambda index, _: SCRIPTED[index] if index < len(SCRIPTED) else None)
    assert waits == expected_waits
    assert set(kinds) == set(EVENTS)  # every kind of poll, the resets used up
    (first_wait,), (result,) = entered(run, "Train.Wait")[:1], entered(run, "Train.Result")
    assert result - first_wait == events_of(kinds)


def attempt_costs(run):
    """Events of a capacity attempt (one Train.Name to the next, its polls included), of a fallback (from
    Train.Fallback to the next attempt's name) and of an endpoint poll (Deploy.Wait to the next)."""
    names, fallback = entered(run, "Train.Name"), entered(run, "Train.Fallback")
    (fell_back,) = fallback
    attempt = max(later - earlier for earlier, later in zip(names, names[1:]) if later < fell_back)
    after = min(name for name in names if name > fell_back)
    endpoint_waits = entered(run, "Deploy.Wait")
    endpoint_poll = max(later - earlier for earlier, later in zip(endpoint_waits, endpoint_waits[1:]))
    return attempt, after - fell_back, endpoint_poll


def test_the_longest_run_the_input_allows_stays_within_70_percent_of_the_history(deployment):
    # Calibration: prepare, every attempt on the first type fails for capacity, the next type trains, a deploy.
    deployment.jobs.scripts += [[("InProgress", "Training", {}), ("Completed", "Completed", {})]] + \
        [CAPACITY] * jobs.MAX_ATTEMPTS + [[("InProgress", "Training", {}), ("Completed", "Completed", COMPLETED_EXTRA)]]
    deployment.jobs.endpoint_script = [("Creating", {})] * 3 + [("InService", {})]
    run = deployment.run(dict(LONGEST_INPUT, hyperparameters={"max_steps": 5}), name="calibration")
    assert run.status == "SUCCEEDED", run.description.get("cause")
    assert run.output["plan"]["instance_type"] == FALLBACKS[0]
    attempt, fallback, endpoint_poll = attempt_costs(run)
    attempts, fallbacks = len(entered(run, "Train.Name")) + len(entered(run, "Prepare.Name")), 1
    # What the calibration run wrote besides its attempts, fallback and endpoint polls: the stages, the two jobs'
    # last polls and results
    fixed = len(run.events) - attempts * attempt - fallbacks * fallback - 4 * endpoint_poll

    # The longest run: the gate's plan of it, as the Validate state gets it
    plan = gate.decide(LONGEST_INPUT, gate.Context(gate.Deployment.of(StandInSettings()))).plan
    poll = plan["poll"]

    def every_poll(wall):
        """A status change at every poll."""
        return lambda index, elapsed: None if elapsed >= wall else ("Training", "Interrupted")[index % 2]

    def after_each_ramp(wall):
        """A change whenever the wait reached its cap: every restart ramps all the way up again."""
        flips = []

        def secondary_at(index, elapsed):
            if elapsed >= wall:
                return None
            if not flips or elapsed - flips[-1][0] >= poll["max_seconds"]:
                flips.append((elapsed, ("Training", "Interrupted")[len(flips) % 2]))
            return flips[-1][1]
        return secondary_at

    polled = max((collections.Counter(kind for wall in (LONGEST, 2 * LONGEST)  # the prepare job, the training job
                                      for kind in monitor(poll, pattern(wall))[1])
                  for pattern in (every_poll, after_each_ramp)), key=lambda counts: events_of(counts.elements()))
    most_attempts = jobs.MAX_ATTEMPTS * (2 + len(FALLBACKS))  # the prepare job's and every type's
    reserved = (fixed + most_attempts * attempt + len(FALLBACKS) * fallback
                + deploy.MAX_POLLS * endpoint_poll)
    total = reserved + events_of(polled.elements())
    print("longest run: %d events of %d (%.0f %%): polls %s at most every %d s, everything else %d (attempt %d, "
          "fallback %d, endpoint poll %d)" % (total, history.HISTORY_EVENTS, 100.0 * total / history.HISTORY_EVENTS,
                                              dict(polled), poll["max_seconds"], reserved, attempt, fallback,
                                              endpoint_poll))
    assert reserved <= history.RESERVED_EVENTS
    assert total <= history.HISTORY_EVENTS * history.HISTORY_SHARE
    # the bound the gate planned with holds for these polls (history.worst_events)
    assert events_of(polled.elements()) <= sum(history.worst_events(wall, poll["max_seconds"])
                                               for wall in (LONGEST, 2 * LONGEST))


def test_a_run_of_a_day_polls_every_15_minutes_at_most():
    plan = gate.decide({"max_runtime_seconds": 86400}, gate.Context(gate.Deployment.of(StandInSettings()))).plan
    assert plan["poll"]["max_seconds"] == history.POLL_MAX_FLOOR == 900
