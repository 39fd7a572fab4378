"""checkpoint_every "auto": Young/Daly's interval against a simulation of Poisson interruptions (issue 43 item 4)."""
import math

import numpy as np
import pytest

from controlplane import checkpoint_plan
from lm.spec import interruptions

SAVE_SECONDS = 60.0
RESTART_SECONDS = 120.0
MTBI_SECONDS = 4 * 3600.0  # a spot job interrupted every 4 hours on average
WORK_SECONDS = 200 * 3600.0
RUNS = 400


def simulated_seconds(interval, seed=7):
    """The mean wall-clock seconds of WORK_SECONDS of training, saved every `interval` seconds of work, under
    interruptions at the times of a Poisson process of mean MTBI_SECONDS.

    An attempt at a segment (its work, then its save) completes only when no interruption falls in it; an
    interruption loses what the segment did so far and costs a restart, then the segment starts over from
    the last save. The process has no memory, so each attempt fails with probability 1 - exp(-length / mtbi),
    the failures before a segment's success are geometric, and the time an attempt lasts before its
    interruption is exponential, cut at the attempt's length."""
    rng = np.random.default_rng(seed)
    whole, rest = divmod(WORK_SECONDS, interval)
    lengths = np.array([interval + SAVE_SECONDS] * int(whole) + ([rest + SAVE_SECONDS] if rest else []))
    failures = rng.geometric(np.exp(-lengths / MTBI_SECONDS), size=(RUNS, len(lengths))) - 1
    cut = np.repeat(np.tile(lengths, RUNS), failures.ravel())  # the length of each failed attempt
    before = -MTBI_SECONDS * np.log1p(-rng.random(len(cut)) * -np.expm1(-cut / MTBI_SECONDS))
    return lengths.sum() + (before.sum() + failures.sum() * RESTART_SECONDS) / RUNS


def test_young_dalys_interval_costs_within_5_percent_of_the_best_interval_a_search_finds():
    chosen = interruptions.young_daly_seconds(SAVE_SECONDS, MTBI_SECONDS)
    assert chosen == pytest.approx(math.sqrt(2 * 60 * 4 * 3600))
    candidates = chosen * np.geomspace(0.05, 20, 61)
    best = min(simulated_seconds(interval) for interval in candidates)
    assert simulated_seconds(chosen) <= 1.05 * best
    # the comparison can tell a poor interval: ten times shorter or longer costs well over 5 % more
    assert simulated_seconds(chosen / 10) > 1.05 * best and simulated_seconds(chosen * 10) > 1.05 * best
    # and the planned expected loss is what the simulation loses at the chosen interval
    lost = simulated_seconds(chosen) / WORK_SECONDS - 1
    assert checkpoint_plan.expected_loss_share(chosen, SAVE_SECONDS, MTBI_SECONDS, RESTART_SECONDS) == pytest.approx(
        lost, rel=0.1)


def test_a_jobs_interruptions_come_as_often_as_any_of_its_instances():
    one = interruptions.job_mtbi_seconds(1, spot=True, gpus_per_host=8)
    assert one == pytest.approx(interruptions.SPOT_INSTANCE_HOURS * 3600)
    assert interruptions.job_mtbi_seconds(4, spot=True, gpus_per_host=8) == pytest.approx(one / 4)
    # on demand: Llama 3's failures per GPU-hour, so an instance of 8 GPUs fails 8 times as often as one of 1
    assert interruptions.job_mtbi_seconds(1, spot=False, gpus_per_host=8) == pytest.approx(
        interruptions.ON_DEMAND_GPU_HOURS * 3600 / 8)
    assert interruptions.job_mtbi_seconds(2, spot=False, gpus_per_host=8, given_hours=10) == 5 * 3600


def test_the_plan_states_the_interval_its_basis_and_the_expected_loss():
    planned = checkpoint_plan.plan(60, 2.0, 2, 8, True, {"checkpoint_minutes": 0})
    mtbi = interruptions.SPOT_INSTANCE_HOURS * 3600 / 2
    assert planned["interval_seconds"] == pytest.approx(math.sqrt(2 * 60 * mtbi), abs=0.1)
    assert planned["interval_steps"] == round(math.sqrt(2 * 60 * mtbi) / 2.0)
    assert planned["interruption_basis"] == "spot default" and planned["effective_seconds"] == planned[
        "interval_seconds"]
    assert "checkpoint_every auto: a save every" in checkpoint_plan.described(planned)
    # checkpoint_minutes saves sooner when it is shorter; a given checkpoint_every is used as given
    assert checkpoint_plan.plan(60, 2.0, 2, 8, True, {"checkpoint_minutes": 15})["effective_seconds"] == 900
    given = checkpoint_plan.plan(60, 2.0, 2, 8, True, {"checkpoint_every": 100, "checkpoint_minutes": 0})
    assert (given["interval_seconds"], given["interval_steps"]) == (200.0, 100)
