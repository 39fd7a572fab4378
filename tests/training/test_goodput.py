"""Where a job's time goes (goodput), across an interruption, and checkpoint_every "auto" (issue 43 items 3, 4)."""
import math
import os

import pytest

from controlplane import metrics
from lm import checkpoint
from lm.training import goodput
from lm.spec import interruptions, job

from . import helpers

JOB = "lmstack-train-goodput-1"


def _parsed(output, prefix):
    """The metrics of every line of `output` starting with `prefix`, in order."""
    return [metrics.parse_metrics(line) for line in helpers.lines(output) if line.startswith(prefix)]


def _totals(output):
    return {name.split(":", 1)[1]: value for name, value in _parsed(output, job.GOODPUT_LOG_PREFIX)[-1].items()}


def _parts(totals):
    return sum(totals[name] for name in ("kept_step_seconds", "startup_seconds", "save_seconds", "eval_seconds",
                                         "redone_seconds", "end_seconds"))


@pytest.mark.slow
def test_a_restarted_job_redoes_the_steps_after_its_checkpoint_and_its_time_adds_up(text_dataset, tmp_path):
    env = helpers.environment(TRAINING_JOB_NAME=JOB)
    # xla off here and below: the ledger does not depend on it, and its compile costs CPU in every process.
    run = dict(max_steps=12, checkpoint_every=4, checkpoint_minutes=0, log_every=1, xla=False)
    first = helpers.run_training(text_dataset, str(tmp_path), env=env, **run)
    assert first.returncode == 0, first.stdout
    # As if the job were interrupted after step 12's progress was written but before its checkpoint landed:
    # the restart finds the checkpoint of step 8 and the count of 12 steps.
    os.remove(os.path.join(str(tmp_path), "ckpt", checkpoint.checkpoint_name(12)))
    second = helpers.run_training(text_dataset, str(tmp_path), env=env, **run)
    assert second.returncode == 0, second.stdout
    (start,) = _parsed(second.stdout, job.GOODPUT_LOG_PREFIX + " start")
    assert (start["goodput:resumed"], start["goodput:resumed_from_step"], start["goodput:steps_lost"]) == (1, 8, 4)
    totals = _totals(second.stdout)
    tokens_per_step = helpers.TINY["global_batch_size"] * 64  # the text dataset's records hold 64 tokens
    assert (totals["kept_steps"], totals["redone_steps"]) == (12, 4)
    assert (totals["kept_tokens"], totals["trained_tokens"]) == (12 * tokens_per_step, 16 * tokens_per_step)
    assert totals["redone_seconds"] > 0
    # both processes' time, counted once: the parts fill the whole to 1 %
    first_totals = _totals(first.stdout)
    assert totals["process_seconds"] > first_totals["startup_seconds"] + first_totals["kept_step_seconds"]
    assert _parts(totals) == pytest.approx(totals["process_seconds"], rel=0.01)
    assert _parts(first_totals) == pytest.approx(first_totals["process_seconds"], rel=0.01)


@pytest.mark.slow
def test_checkpoint_every_auto_saves_every_young_daly_interval_and_replans_after_the_first_save(
        text_dataset, tmp_path):
    hours = 1e-6  # an interruption every 3.6 ms: an interval shorter than a step, a save at every log window
    result = helpers.run_training(text_dataset, str(tmp_path), checkpoint_every="auto", checkpoint_minutes=0,
                                  interruption_hours=hours, max_steps=30, xla=False)
    assert result.returncode == 0, result.stdout
    choices = [line for line in helpers.lines(result.stdout) if line.startswith("checkpoint_every auto:")]
    assert "planned from the checkpoint's size" in choices[0] and "measured at the first save" in choices[1]
    planned = float(choices[0].split("a save every ")[1].split()[0])
    save = float(choices[0].split("Young/Daly: a ")[1].split()[0])
    assert save >= job.SAVE_OVERHEAD_SECONDS  # lm.spec.job.save_seconds of the state: planned, not measured
    assert planned == pytest.approx(math.sqrt(2 * save * hours * 3600), abs=0.1)
    saves = _parsed(result.stdout, job.CHECKPOINT_LOG_PREFIX)
    first = saves[0]
    assert first["checkpoint:interval_seconds"] == pytest.approx(interruptions.young_daly_seconds(
        first["checkpoint:save_seconds"], hours * 3600), abs=0.1)
    assert len(saves) > 1  # a measured save is far shorter than the planned one: saves come sooner


def test_a_rollback_moves_the_steps_it_throws_away_from_kept_to_redone(tmp_path):
    """Steps 2-10 saved at 10, 11-15 saved at 15, 16-17 not saved; the defense restores step 10 at step 17."""
    now = [0.0]
    ledger = goodput.Ledger(JOB, 100, str(tmp_path), process_start=0.0, clock=lambda: now[0])

    def steps(count):
        for _ in range(count):
            now[0] += 1.0 if ledger.started else 2.0  # the first step, the start-up, takes 2 s
            ledger.step_done()

    steps(10)
    ledger.commit()
    restored = {"goodput": ledger.record(10)}
    steps(5)
    ledger.commit()
    steps(2)
    ledger.rolled_back(restored, 17, 10)
    totals = ledger.totals(10)
    assert (totals["kept_steps"], totals["redone_steps"]) == (10, 7)
    assert (totals["kept_step_seconds"], totals["redone_seconds"], totals["startup_seconds"]) == (9.0, 7.0, 2.0)
    assert _parts(totals) == totals["process_seconds"] == 18.0
