"""The checkpoint interval a run is planned with: `checkpoint_every: "auto"` (`lm.spec.interruptions`).

With "auto" (the default) the job saves every Young/Daly interval of training, sqrt(2 x save seconds x mean
seconds between the job's interruptions), planned here from the checkpoint's size (`lm.spec.job.save_seconds`)
and measured again by the job at its first save; `checkpoint_minutes` still saves sooner when it is shorter.
A given `checkpoint_every` (steps) is used as given. The mean time between interruptions is the
hyperparameter `interruption_hours` per instance, whose 0 means the default for the run's capacity
(`lm.spec.interruptions`: spot or on demand); the gate writes the default it used into the job's
hyperparameters (`check_checkpoints`), so the job re-plans with the same figure.

Pure Python, no TensorFlow.
"""
import collections

from lm.spec import interruptions, job
from lm.spec.hardware import INSTANCES


def expected_loss_share(interval_seconds, save_seconds, mtbi_seconds, restart_seconds=0.0):
    """The expected share of the time lost at an interval of `interval_seconds`: save / interval for the saves,
    plus, per interruption (1 / mtbi of them a second), half an interval of work redone on average and the
    restart (first order in save / mtbi and interval / mtbi)."""
    return save_seconds / interval_seconds + (interval_seconds / 2.0 + restart_seconds) / mtbi_seconds


def plan(save_seconds, step_seconds, instance_count, gpus_per_host, spot, hyperparameters):
    """What the run's checkpoints will cost: the interval, its basis and the expected loss."""
    given_hours = hyperparameters.get("interruption_hours") or 0.0
    hours = given_hours or interruptions.instance_hours(spot, gpus_per_host)
    mtbi = interruptions.job_mtbi_seconds(instance_count, spot, gpus_per_host, hours)
    every = hyperparameters.get("checkpoint_every", job.HYPERPARAMETERS["checkpoint_every"].default)
    minutes = hyperparameters.get("checkpoint_minutes", job.HYPERPARAMETERS["checkpoint_minutes"].default)
    auto = every == interruptions.AUTO
    interval = interruptions.young_daly_seconds(save_seconds, mtbi) if auto else every * step_seconds
    intervals = [seconds for seconds in (interval, minutes * 60.0) if seconds > 0]
    effective = min(intervals) if intervals else None
    return collections.OrderedDict([
        ("checkpoint_every", every), ("interval_seconds", round(interval, 1)),
        ("interval_steps", max(1, int(round(interval / step_seconds))) if step_seconds and interval else None),
        ("effective_seconds", None if effective is None else round(effective, 1)),
        ("save_seconds", save_seconds), ("interruption_hours", hours),
        ("interruption_basis", "given" if given_hours else ("spot default" if spot else "on-demand default")),
        ("mtbi_seconds", round(mtbi)),
        ("expected_loss_share", None if effective is None else round(
            expected_loss_share(effective, save_seconds, mtbi), 4)),
    ])


def described(planned):
    """The plan's line about checkpoints."""
    if planned["checkpoint_every"] == interruptions.AUTO:
        choice = "checkpoint_every auto: a save every %d s of training (Young/Daly: a %d s save, an interruption " \
                 "every %.0f hours of the job, %s)" % (planned["interval_seconds"], planned["save_seconds"],
                                                       planned["mtbi_seconds"] / 3600.0, planned["interruption_basis"])
    else:
        choice = "checkpoint_every %d steps (%d s of training)" % (planned["checkpoint_every"],
                                                                    planned["interval_seconds"])
    if planned["effective_seconds"] is None:
        return choice + "; no periodic checkpoint (an interruption loses everything since the start)"
    sooner = " (checkpoint_minutes is sooner: every %d s)" % planned["effective_seconds"] \
        if planned["effective_seconds"] < planned["interval_seconds"] else ""
    return "%s%s; expected loss %.1f %% of the training time (saves and work redone after interruptions)" % (
        choice, sooner, 100 * planned["expected_loss_share"])


def resolve_interruption_hours(config):
    """The config with the run's mean hours between interruptions of an instance in its hyperparameters (0: the
    default for its capacity, made explicit); that figure."""
    hyperparameters = config["hyperparameters"]
    hyperparameters["interruption_hours"] = hyperparameters["interruption_hours"] or interruptions.instance_hours(
        config["spot"], INSTANCES[config["instance_type"]].gpus)
    return hyperparameters["interruption_hours"]


def check_checkpoints(decision, context):
    """The gate's check: the plan's `checkpoints` (with the line `lmstack.plan` prints), and the mean time between
    interruptions written into the job's hyperparameters (its default made explicit)."""
    config = decision.config
    if config["deploy"]["model_artifact"] is not None or not decision.plan.get("steps"):
        return
    hyperparameters = config["hyperparameters"]
    step_seconds = decision.plan["hours"] * 3600.0 / decision.plan["steps"]
    planned = plan(decision.plan["save_seconds"], step_seconds, config["instance_count"],
                   INSTANCES[config["instance_type"]].gpus, config["spot"], hyperparameters)
    resolve_interruption_hours(config)
    decision.plan["checkpoints"] = dict(planned, described=described(planned))
