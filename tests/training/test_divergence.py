"""A diverging run defends itself (lm.training.divergence): non-finite steps skipped, loss spikes rolled back
past their data, at most max_rollbacks times; LMSTACK_FAULTS drills cause them."""
import glob
import json
import os
import re
import subprocess

import numpy as np
import pytest

from controlplane import metrics as log_metrics
from lm import checkpoint
from lm.spec import drill, job
from lm.training import divergence

from . import helpers

# Checkpoints every 10 steps (two kept), a small skip so the 70 steps stay in the first epoch; a flat learning rate
# of 0.002 after warm-up, so that 1000 times it at step 40 wrecks the weights as a real spike would.
RUN = dict(max_steps=70, checkpoint_every=10, log_every=10, eval_batches=4, xla=False, rollback_skip=20,
           learning_rate=0.002, min_lr_ratio=1.0)
LR_SPIKE = "lr_spike@40x1000"


# name -> (LMSTACK_FAULTS, hyperparameters beyond RUN) of the drills' runs, one after another in one process.
RUNS = {"clean": ("", {}), "defended": (LR_SPIKE, {}), "undefended": (LR_SPIKE, {"spike_detection": False}),
        "nan": ("nan@30", {"max_steps": 40}),
        "healthy": ("", {"max_steps": 300, "checkpoint_every": 100, "log_every": 50}),
        "too_many_rollbacks": ("spike@25:3,spike@45:3", {"max_rollbacks": 1, "max_steps": 60}),
        "spot": (LR_SPIKE, {})}  # SIGTERM at its rollback, then the same run again (SPOT_RESTART)
SPOT_RESTART = "spot_restart"


def events(output, event):
    """The [divergence] lines of `event`, as SageMaker's metric definitions read them."""
    return [dict(log_metrics.parse_metrics(line), line=line) for line in helpers.lines(output)
            if line.startswith("%s %s " % (job.DIVERGENCE_LOG_PREFIX, event))]


def final_weights(directory, step):
    with np.load(os.path.join(directory, "ckpt", checkpoint.checkpoint_name(step))) as data:
        return {name: data[name] for name in data.files if name != checkpoint.META_KEY}


@pytest.fixture(scope="module")
def runs(text_dataset, tmp_path_factory):
    """name -> (directory, exit status, output) of each of RUNS and of SPOT_RESTART; each run's directory is its
    SAGEMAKER_BASE_DIR (where a failure file goes)."""
    directories = {name: str(tmp_path_factory.mktemp(name)) for name in RUNS}
    launches = [(helpers.cli_args(text_dataset, directories[name], **dict(RUN, **extra)),
                 {drill.FAULTS_ENVIRONMENT: faults, "SAGEMAKER_BASE_DIR": directories[name]})
                for name, (faults, extra) in RUNS.items()]
    spot = list(RUNS).index("spot")

    def interrupt_the_spot_run_at_its_rollback(run, line):
        return run == spot and line.startswith(job.DIVERGENCE_LOG_PREFIX + " rollback")

    ended = helpers.run_one_after_another(launches + [launches[spot]],
                                          sigterm_when=interrupt_the_spot_run_at_its_rollback)
    found = {name: (directories[name], status, output) for name, (status, output) in zip(RUNS, ended)}
    found[SPOT_RESTART] = (directories["spot"],) + ended[-1]
    return found


@pytest.fixture(scope="module")
def reference(runs):
    """The run without a fault, and the lr_spike@40x1000 drill with and without spike detection."""
    for name in ("clean", "defended", "undefended"):
        assert runs[name][1] == 0, runs[name][2]
    return {name: (runs[name][0], runs[name][2]) for name in ("clean", "defended", "undefended")}


# ---- the decisions, without training ----

def test_faults_parse_and_name_the_forms_allowed():
    assert drill.parse_faults("lr_spike@40x1000, nan@30,spike@50:4,lr_spike@7") == {
        "lr": {40: 1000.0, 7: drill.DEFAULT_LR_FACTOR}, "nan": {30}, "spike": {50: 4}}
    for bad in ("nan@0", "spike@5", "lr_spike@x3", "explode@3", "spike@5:0"):
        with pytest.raises(ValueError, match="lr_spike@STEP\\[xFACTOR\\], nan@STEP, spike@STEP:COUNT"):
            drill.parse_faults(bad)


def hyperparameters(**values):
    return type("HP", (), dict(job.validate_hyperparameters({}), **values))


def test_a_noisy_falling_loss_is_no_spike_and_a_jump_is():
    guard = divergence.Divergence(hyperparameters())
    noise = np.random.RandomState(0).normal(0.0, 0.05, 300)
    for step in range(1, 301):  # warm-up's fall from 11 to 3, then noise
        assert guard.observe(step, max(3.0, 11.0 - step * 0.1) + noise[step - 1], True) == (None, step)
    assert guard.observe(301, 9.0, True) == (None, 301)
    assert guard.observe(302, 9.0, True) == (None, 302)
    assert guard.observe(303, 9.0, True) == ("rollback", 301)


def test_consecutive_non_finite_steps_roll_back_and_a_finite_one_resets_them():
    guard = divergence.Divergence(hyperparameters(nonfinite_limit=2))
    assert guard.observe(5, float("nan"), False) == ("skipped", 5)
    assert guard.observe(6, 3.0, True) == (None, 6)
    assert guard.observe(7, float("inf"), False) == ("skipped", 7)
    assert guard.observe(8, float("nan"), False) == ("rollback", 7)
    assert guard.skipped_steps == 3


def test_the_rollback_target_precedes_the_update_before_the_first_high_loss():
    guard = divergence.Divergence(hyperparameters())
    # The loss of step 41 is of the weights after step 40: the checkpoint of step 40 holds the bad update.
    assert guard.target([30, 40], began=41) == 30
    assert guard.target([40, 50], began=41) is None
    first, end = guard.roll_back(43, 30, lambda step: step)
    assert (first, end) == (30, 230)  # rollback_skip 200 batches from the checkpoint's position
    assert guard.data_offset == 200 and not guard.fresh(40) and guard.fresh(44)
    resumed = divergence.Divergence(hyperparameters())
    resumed.resume({"divergence": guard.record()})
    assert resumed.data_offset == 200 and resumed.rollbacks == guard.rollbacks


# ---- the drills, through lm.training.train ----

@pytest.mark.slow
def test_nan_step_is_skipped_counted_and_leaves_every_weight_finite(runs):
    directory, status, output = runs["nan"]
    assert status == 0, output
    (skipped,) = events(output, "skipped")
    assert "step=30 epoch=0 batch=29" in skipped["line"] and skipped["train:skipped_steps"] == 1
    (summary,) = events(output, "summary")
    assert summary["train:skipped_steps"] == 1 and summary["train:rollbacks"] == 0
    for name, weight in final_weights(directory, 40).items():
        assert np.isfinite(weight).all(), name


@pytest.mark.slow
def test_lr_spike_rolls_back_before_it_and_skips_its_data(reference):
    clean, defended, undefended = (reference[name][1] for name in ("clean", "defended", "undefended"))
    (rollback,) = events(defended, "rollback")
    assert "restored the checkpoint of step 30, skipping batches 30-49" in rollback["line"], rollback["line"]
    assert rollback["train:rollbacks"] == 1
    clean_loss, defended_loss = helpers.val_losses(clean)[-1], helpers.val_losses(defended)[-1]
    assert defended_loss == pytest.approx(clean_loss, rel=0.05)
    undefended_loss = helpers.val_losses(undefended)[-1]
    assert not np.isfinite(undefended_loss) or undefended_loss >= 1.2 * clean_loss, (undefended_loss, clean_loss)
    assert not events(undefended, "rollback")
    meta = checkpoint.read_meta(os.path.join(reference["defended"][0], "ckpt", checkpoint.checkpoint_name(70)))
    assert meta["divergence"]["data_offset"] == 20 and meta["batch"] == 90
    # goodput: the steps after step 30 that the rollback threw away are redone, not kept
    detected = int(re.search(r" step=(\d+) ", rollback["line"]).group(1))
    totals = [log_metrics.parse_metrics(line) for line in helpers.lines(defended)
              if line.startswith(job.GOODPUT_LOG_PREFIX + " kept_steps=")][-1]
    assert (totals["goodput:kept_steps"], totals["goodput:redone_steps"]) == (70, detected - 30), totals
    assert totals["goodput:trained_tokens"] == totals["goodput:kept_tokens"] * (70 + detected - 30) / 70
    assert totals["goodput:redone_seconds"] > 0


@pytest.mark.slow
def test_a_spot_interruption_after_a_rollback_resumes_past_the_skipped_window(runs, reference):
    # The restart runs in the interrupted run's process after it, as the drill's other runs do after each other:
    # everything it resumes comes from the checkpoint (a new strategy, model, optimizer and drill each run).
    directory, status, first = runs["spot"]
    assert status == 0, first
    assert "SIGTERM: saved a checkpoint" in first
    _, status, resumed = runs[SPOT_RESTART]
    assert status == 0 and "resumed from" in resumed, resumed
    assert not events(resumed, "rollback"), "the drill's fault does not fire again on a replayed step"
    # The same weights as the uninterrupted run: the same batches in the same order, the window not replayed.
    expected = final_weights(reference["defended"][0], 70)
    got = final_weights(directory, 70)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


@pytest.mark.slow
def test_more_rollbacks_than_allowed_end_the_job_with_the_steps_and_a_checkpoint(runs):
    directory, status, output = runs["too_many_rollbacks"]
    assert status == 4, output
    with open(os.path.join(directory, "output", "failure")) as failure:
        reason = failure.read()
    assert "diverged more than max_rollbacks=1 times" in reason, reason
    assert "step 27 rolled back to 20, batches 20-39 skipped" in reason, reason
    assert "step 47 rolled back to 40, batches 60-79 skipped" in reason, reason
    saved = sorted(glob.glob(os.path.join(directory, "ckpt", "ckpt-*.npz")))
    assert saved[-1].endswith(checkpoint.checkpoint_name(40)), saved
    assert checkpoint.read_meta(saved[-1])["divergence"]["data_offset"] == 40


@pytest.mark.slow
def test_a_healthy_run_of_300_steps_triggers_nothing(runs):
    _, status, output = runs["healthy"]
    assert status == 0, output
    (summary,) = events(output, "summary")
    assert summary["train:skipped_steps"] == 0 and summary["train:rollbacks"] == 0
    assert not events(output, "skipped") and not events(output, "rollback")


@pytest.mark.slow
def test_two_mwms_workers_roll_back_together_though_only_the_chief_holds_checkpoints(text_dataset, tmp_path,
                                                                                      reference):
    from .test_distributed import digests, free_ports

    workers = ["127.0.0.1:%d" % port for port in free_ports(2)]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = helpers.environment(LM_REPORT_WEIGHT_DIGEST="1", TF_CONFIG=json.dumps(tf_config),
                                  **{drill.FAULTS_ENVIRONMENT: LR_SPIKE})
        args = helpers.train_args(text_dataset, str(tmp_path / ("w%d" % index)), strategy="mwms", **RUN)
        processes.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [process.communicate(timeout=900)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    (rollback,) = events(outputs[0], "rollback")
    assert "restored the checkpoint of step 30, skipping batches 30-49" in rollback["line"]
    found = digests(outputs[0] + outputs[1])
    assert sorted(found) == [0, 1] and found[0] == found[1], "the workers' weights stayed equal"
    assert helpers.val_losses(outputs[0])[-1] == pytest.approx(helpers.val_losses(reference["clean"][1])[-1], rel=0.05)


def test_the_demo_report_counts_the_last_divergence_line():
    from lmstack import demo_report

    log = "\n".join([job.format_divergence_log("skipped", 30, 0, 29, 1, 0, "loss=nan"),
                     "[train] step=40 loss=5.1",
                     job.format_divergence_log("summary", 70, 0, 89, 1, 1, "at the end of this process")])
    assert demo_report.divergence_counts(log) == (1, 1)
    assert demo_report.divergence_counts("[train] step=40 loss=5.1") is None
