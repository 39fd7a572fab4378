"""lm.checkpoint: atomic files, newest complete one wins, mismatches are named."""
import os

import numpy as np
import pytest

from lm import checkpoint
from lm.compat import tf


def variables():
    return [tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3)), tf.Variable(np.int64(3))]


def test_save_restore_round_trip_and_keep(tmp_path):
    saver = checkpoint.Checkpointer(str(tmp_path), keep=2)
    state = variables()
    for step in (10, 20, 30):
        state[1].assign(step)
        saver.save(step, state, {"note": "x"})
    assert saver.steps() == [20, 30]
    fresh = variables()
    meta = checkpoint.restore(saver.latest(), fresh)
    assert meta["step"] == 30 and meta["note"] == "x"
    assert int(fresh[1].numpy()) == 30
    np.testing.assert_array_equal(fresh[0].numpy(), state[0].numpy())


def test_half_written_and_other_tags_are_never_picked(tmp_path):
    saver = checkpoint.Checkpointer(str(tmp_path))
    saver.save(5, variables(), {})
    with open(os.path.join(str(tmp_path), "ckpt-00000009.npz.tmp-123"), "wb") as handle:
        handle.write(b"partial")
    checkpoint.Checkpointer(str(tmp_path), tag="-pp1").save(7, variables(), {})
    assert saver.latest() == os.path.join(str(tmp_path), "ckpt-00000005.npz")
    assert not [name for name in os.listdir(str(tmp_path)) if ".tmp-" in name and name.startswith("ckpt-00000005")]


def test_no_checkpoint_directory_means_no_checkpoint(tmp_path):
    assert checkpoint.Checkpointer(str(tmp_path / "missing")).latest() is None


def test_shape_or_count_mismatch_names_the_file(tmp_path):
    saver = checkpoint.Checkpointer(str(tmp_path))
    path = saver.save(1, variables(), {})
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-00000001.npz.*shape"):
        checkpoint.restore(path, [tf.Variable(np.zeros((3, 2), np.float32)), tf.Variable(np.int64(0))])
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-00000001.npz: holds 2 variables.*has 1"):
        checkpoint.restore(path, variables()[:1])
    broken = os.path.join(str(tmp_path), "ckpt-00000002.npz")
    with open(broken, "wb") as handle:
        handle.write(b"not a zip")
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-00000002.npz: not a readable checkpoint"):
        checkpoint.restore(broken, variables())
