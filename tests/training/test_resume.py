"""Exact resume through `lm.training.train`: dropout masks keyed by (seed, step, replica), the dataset's
fingerprint in the checkpoint, time-based periodic checkpoints, TensorBoard scalars."""
import glob
import json
import os
import shutil

import numpy as np
import pytest

from lm import checkpoint
from lm.spec import shards
from family_cases import tiny_presets

from . import helpers
from .test_summaries import read_scalars
from checkpoint_listing import checkpoint_files

DROPOUT = dict(max_steps=8, checkpoint_every=4, dropout=0.2, xla=False)


def checkpoint_arrays(path):
    with np.load(path) as data:
        return {name: data[name] for name in data.files if name != checkpoint.META_KEY}


# The families that recompute: recomputation redraws each dropout mask from the step's seed
# (lm.models.layers.dropout), the same seed a resumed run draws (lm.training.checkpoint.DropoutKey).
RECOMPUTING = tiny_presets("recompute")


@pytest.fixture(scope="module")
def straight_runs(text_dataset, tmp_path_factory):
    """preset -> (directory, output) of an uninterrupted DROPOUT run of each of RECOMPUTING, one after another in
    one process."""
    directories = {preset: str(tmp_path_factory.mktemp("straight")) for preset, _ in RECOMPUTING}
    ended = helpers.run_one_after_another([
        (helpers.cli_args(text_dataset, directories[preset], **dict(DROPOUT, preset=preset, model=model)), {})
        for preset, model in RECOMPUTING])
    assert [status for status, _ in ended] == [0] * len(RECOMPUTING), ended
    return {preset: (directories[preset], output) for (preset, _), (_, output) in zip(RECOMPUTING, ended)}


@pytest.mark.slow
@pytest.mark.parametrize("preset, model", RECOMPUTING)
def test_resume_with_dropout_is_bit_exact(text_dataset, tmp_path, straight_runs, preset, model):
    # The resumed run in a fresh process: a resumed run is a new process, whose global random generator starts
    # over (the straight runs share one, so each resumes where its straight run's generator was not).
    straight_dir, straight_output = straight_runs[preset]
    resumed_dir = str(tmp_path / "resumed")
    os.makedirs(os.path.join(resumed_dir, "ckpt"))
    shutil.copy(os.path.join(straight_dir, "ckpt", checkpoint.checkpoint_name(4)),
                os.path.join(resumed_dir, "ckpt"))  # as if killed after the checkpoint of step 4
    resumed = helpers.run_training(text_dataset, resumed_dir, **dict(DROPOUT, preset=preset, model=model))
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stdout
    expected = checkpoint_arrays(os.path.join(straight_dir, "ckpt", checkpoint.checkpoint_name(8)))
    got = checkpoint_arrays(os.path.join(resumed_dir, "ckpt", checkpoint.checkpoint_name(8)))
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    straight_losses, resumed_losses = helpers.losses(straight_output), helpers.losses(resumed.stdout)
    assert [resumed_losses[step] for step in range(5, 9)] == [straight_losses[step] for step in range(5, 9)]


def other_dataset(text_dataset, target):
    """The same files under a manifest that lists one shard's hash differently: other data, as
    far as the fingerprint can tell, and the start-up check (sizes only) still passes."""
    shutil.copytree(text_dataset, target)
    path = shards.manifest_path(target)
    with open(path) as handle:
        manifest = json.load(handle)
    manifest["shards"][0]["sha256"] = "0" * 64
    with open(path, "w") as handle:
        json.dump(manifest, handle)
    return target


@pytest.mark.slow
def test_resuming_on_other_data_is_refused_unless_allowed(text_dataset, tmp_path, capsys):
    tmp = str(tmp_path)
    status, output = helpers.run_in_process(capsys, text_dataset, tmp, max_steps=4, xla=False)
    assert status == 0, output
    meta = checkpoint.read_meta(os.path.join(tmp, "ckpt", checkpoint.checkpoint_name(4)))
    assert meta["dataset_fingerprint"] == shards.fingerprint(shards.load_manifest(text_dataset))
    other = other_dataset(text_dataset, str(tmp_path / "other"))
    status, output = helpers.run_in_process(capsys, other, tmp, max_steps=6, xla=False)
    assert status == 2
    assert "ckpt-00000004.npz: was trained on dataset %s" % meta["dataset_fingerprint"] in output
    assert "allow_new_data=true (--allow-new-data)" in output
    status, output = helpers.run_in_process(capsys, other, tmp, max_steps=6, xla=False, allow_new_data=True)
    assert status == 0 and "resumed from" in output and "on another dataset" in output, output


@pytest.mark.slow
def test_checkpoints_of_another_model_are_refused_naming_both_and_resume_from(text_dataset, tmp_path, capsys):
    """What a SageMaker run whose resume_from names another model's checkpoints meets (issue 24.6):
    they are synced into its checkpoint directory, and lm.training.train refuses them before step 1."""
    tmp = str(tmp_path)
    status, output = helpers.run_in_process(capsys, text_dataset, tmp, max_steps=2, xla=False)
    assert status == 0, output
    status, output = helpers.run_in_process(capsys, text_dataset, tmp, max_steps=4, xla=False, preset="rnn-tiny",
                                            model="rnn")
    assert status == 2
    assert "ckpt-00000002.npz: was written with hyperparameters.preset='tiny', this run has 'rnn-tiny'" in output
    assert "leave resume_from out of the execution input" in output
    status, output = helpers.run_in_process(capsys, other_dataset(text_dataset, str(tmp_path / "other")), tmp,
                                            max_steps=4, xla=False)
    assert status == 2 and "was trained on dataset" in output and "leave resume_from out" in output


@pytest.mark.slow
def test_time_based_checkpoints_and_tensorboard_scalars(text_dataset, tmp_path, capsys):
    # checkpoint_minutes tiny: every log window (2 steps) is past it, so every window saves.
    tmp = str(tmp_path)
    tensorboard = os.path.join(tmp, "tb")
    from lm.training import train

    capsys.readouterr()
    status = train.main(helpers.cli_args(text_dataset, tmp, max_steps=6, log_every=2, xla=False,
                                         checkpoint_minutes=1e-6) + ["--tensorboard-dir", tensorboard])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert status == 0, output
    saved = checkpoint_files(os.path.join(tmp, "ckpt"))
    assert saved == [checkpoint.checkpoint_name(4), checkpoint.checkpoint_name(6)], saved  # keep=2 of 2, 4, 6
    scalars = read_scalars(tensorboard)
    logged = helpers.losses(output)
    assert [step for step, _ in scalars["train/loss"]] == [2, 4, 6]
    for step, value in scalars["train/loss"]:
        assert value == pytest.approx(logged[step], abs=1e-4)
    for tag in ("learning_rate", "grad_norm", "tokens_per_s", "mfu", "loss_scale"):
        assert [step for step, _ in scalars["train/" + tag]] == [2, 4, 6]
    assert scalars["train/loss_scale"][0][1] == 1.0
    assert [step for step, _ in scalars["validation/loss"]] == [6]
    # the goodput totals at each save (2, 4, 6) and at the end (6), as the [goodput] lines give them
    totals = [line.split()[1:] for line in output.splitlines() if line.startswith("[goodput] kept_steps=")]
    assert [step for step, _ in scalars["goodput/kept_steps"]] == [2, 4, 6, 6]
    assert [value for _, value in scalars["goodput/kept_tokens"]] == [
        float(pair.split("=")[1]) for line in totals for pair in line if pair.startswith("kept_tokens=")]
    assert glob.glob(os.path.join(tensorboard, "events.out.tfevents.*"))
