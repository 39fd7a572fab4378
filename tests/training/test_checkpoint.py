"""lm.checkpoint: atomic files, newest complete one wins, mismatches and damage are named, the
background writer is paced while no core is idle and on disk after wait()."""
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from controlplane import planner
from lm import checkpoint
from lm.compat import tf

# The SMP image's runtime uses these too: tests/tf26 runs them on its framework.
pytestmark = pytest.mark.tf26


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
    saver.wait()  # the path names the file once the background write is done
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-00000001.npz.*shape"):
        checkpoint.restore(path, [tf.Variable(np.zeros((3, 2), np.float32)), tf.Variable(np.int64(0))])
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-00000001.npz: holds 2 variables.*has 1"):
        checkpoint.restore(path, variables()[:1])
    broken = os.path.join(str(tmp_path), "ckpt-00000002.npz")
    with open(broken, "wb") as handle:
        handle.write(b"not a zip")
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-00000002.npz: not a readable checkpoint"):
        checkpoint.restore(broken, variables())


@pytest.mark.parametrize("damage", ["truncated", "bit flipped in the data", "no metadata"])
def test_a_damaged_file_is_refused_with_its_name(tmp_path, damage):
    state = [tf.Variable(np.arange(50000, dtype=np.float32)), tf.Variable(np.int64(3))]
    path = checkpoint.Checkpointer(str(tmp_path), background=False).save(1, state, {})
    data = bytearray(open(path, "rb").read())
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "bit flipped in the data":
        data[len(data) // 3] ^= 0x10  # inside v00000's array: only its CRC-32 tells
    else:
        data = data.replace(b"__meta__.npy", b"__xxxx__.npy")
    with open(path, "wb") as handle:
        handle.write(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-00000001.npz: not a readable checkpoint"):
        checkpoint.restore(path, state)
    np.testing.assert_array_equal(state[0].numpy(), np.arange(50000, dtype=np.float32))  # nothing assigned
    if damage != "bit flipped in the data":  # read_meta reads only the metadata member
        with pytest.raises(checkpoint.CheckpointError, match="ckpt-00000001.npz: not a readable checkpoint"):
            checkpoint.read_meta(path)


KILLED_WRITER = """
import os, sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
from lm import checkpoint


checkpoint.CHUNK_BYTES = 4096
saver = checkpoint.Checkpointer(sys.argv[1])
saver._write(1, [np.zeros(10000, np.float32)], {"shapes": [[10000]]}, lambda: None)

def hold_after_first_chunk():
    print("writing", flush=True)
    time.sleep(600)

saver._write(2, [np.ones(10000, np.float32)], {"shapes": [[10000]]}, hold_after_first_chunk)
"""


def test_a_process_killed_mid_write_leaves_no_file_with_the_final_name(tmp_path):
    # The writer's own code (Checkpointer._write, as the writer thread runs it), SIGKILLed after
    # its first 4 KB of step 2: only the temporary file exists, and step 1 is the newest.
    training_image = os.path.dirname(os.path.dirname(os.path.abspath(checkpoint.__file__)))
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path), training_image],
                              stdout=subprocess.PIPE)
    try:
        assert writer.stdout.readline() == b"writing\n"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    names = sorted(os.listdir(str(tmp_path)))
    assert names[0] == "ckpt-00000001.npz" and names[1].startswith("ckpt-00000002.npz.tmp-") and len(names) == 2
    saver = checkpoint.Checkpointer(str(tmp_path))
    assert saver.steps() == [1]
    fresh = [tf.Variable(np.full(10000, 7, np.float32))]
    checkpoint.restore(saver.latest(), fresh)
    np.testing.assert_array_equal(fresh[0].numpy(), np.zeros(10000, np.float32))


class RecordedWaits:
    """A stand-in for the pacer's threading.Event: records how long it was asked to wait."""

    def __init__(self, is_set=False):
        self.waits, self._set = [], is_set

    def is_set(self):
        return self._set

    def wait(self, seconds):
        self.waits.append(seconds)


def test_the_pacer_sleeps_so_the_writer_uses_its_share_only_while_no_core_is_idle():
    cpu = [10.0]
    idle = [0.4]
    hurry = RecordedWaits()
    pacer = checkpoint.Pacer(0.02, hurry, lambda: idle[0], cpu_clock=lambda: cpu[0])
    cpu[0] += 0.01  # a chunk took 10 ms of the writer's CPU, no core idle: wait 490 ms (2 % duty)
    pacer.chunk_done()
    idle[0] = 1.5  # a whole core idle: the next chunk goes on at once
    cpu[0] += 0.01
    pacer.chunk_done()
    idle[0] = 0.0
    cpu[0] += 0.002
    pacer.chunk_done()
    assert hurry.waits == pytest.approx([0.49, 0.098])
    hurried = RecordedWaits(is_set=True)  # wait() was called: no more pauses
    pacer = checkpoint.Pacer(0.02, hurried, lambda: 0.0, cpu_clock=lambda: cpu[0])
    cpu[0] += 0.01
    pacer.chunk_done()
    unpaced = RecordedWaits()
    pacer = checkpoint.Pacer(1.0, unpaced, lambda: 0.0, cpu_clock=lambda: cpu[0])
    cpu[0] += 0.01
    pacer.chunk_done()
    assert hurried.waits == unpaced.waits == []


def test_idle_cores_come_from_proc_stat_over_a_window(tmp_path):
    stat = tmp_path / "stat"
    now = [0.0]

    def counters(user, idle, iowait):  # user nice system idle iowait irq softirq steal guest guest_nice
        stat.write_text("cpu  %d 0 0 %d %d 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n" % (user, idle, iowait))

    counters(100, 100, 0)
    idle_cores = checkpoint.IdleCores(window=0.25, path=str(stat), clock=lambda: now[0], cores=4)
    assert idle_cores() == 0.0  # no window yet: taken as busy
    counters(250, 140, 10)  # 200 ticks: 150 busy, 50 idle (iowait is idle) -> 1 of 4 cores idle
    now[0] = 0.1
    assert idle_cores() == 0.0  # still inside the window
    now[0] = 0.3
    assert idle_cores() == pytest.approx(1.0)
    counters(250, 340, 10)  # all 200 ticks idle
    now[0] = 0.6
    assert idle_cores() == pytest.approx(4.0)
    unreadable = checkpoint.IdleCores(window=0.25, path=str(tmp_path / "missing"), clock=lambda: now[0], cores=4)
    now[0] = 1.0
    assert unreadable() == 0.0


def test_a_paced_background_write_is_on_disk_after_wait(tmp_path):
    # A share this small would pace the write for hours; wait() ends the pacing and returns
    # once the file is complete under its final name.
    saver = checkpoint.Checkpointer(str(tmp_path), writer_share=1e-6)
    saver._idle_cores = lambda: 0.0  # no core idle: every chunk is paced
    state = [tf.Variable(np.arange(3 * checkpoint.CHUNK_BYTES // 4, dtype=np.float32)), tf.Variable(np.int64(3))]
    path = saver.save(9, state, {"note": "paced"})
    assert saver.writing()
    saver.wait()
    assert not saver.writing() and sorted(os.listdir(str(tmp_path))) == ["ckpt-00000009.npz"]
    fresh = [tf.Variable(np.zeros_like(state[0].numpy())), tf.Variable(np.int64(0))]
    assert checkpoint.restore(path, fresh)["note"] == "paced"
    np.testing.assert_array_equal(fresh[0].numpy(), state[0].numpy())


def test_writer_share_outside_0_to_1_is_refused(tmp_path):
    for share in (0, 1.5):
        with pytest.raises(ValueError, match="writer_share must be in \\(0, 1\\].*%r" % share):
            checkpoint.Checkpointer(str(tmp_path), writer_share=share)


def test_background_save_snapshots_the_values_at_the_call(tmp_path):
    saver = checkpoint.Checkpointer(str(tmp_path))
    state = variables()
    path = saver.save(4, state, {})
    state[0].assign(state[0] * 0 - 1)  # the next step changes the variables while the write may still run
    state[1].assign(99)
    saver.wait()
    fresh = variables()
    checkpoint.restore(path, fresh)
    np.testing.assert_array_equal(fresh[0].numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert int(fresh[1].numpy()) == 3
    assert sorted(os.listdir(str(tmp_path))) == ["ckpt-00000004.npz"]


def test_a_pending_write_keeps_the_saved_values_through_updates_in_place(tmp_path, monkeypatch):
    # Updates in place in a tf.function (like the train step's assign_sub and a sparse scatter) while
    # the write waits leave the file with the values of the save: the snapshot is a copy.
    saver = checkpoint.Checkpointer(str(tmp_path))
    state = variables()
    gate = threading.Event()
    write = checkpoint.Checkpointer._write
    monkeypatch.setattr(checkpoint.Checkpointer, "_write", lambda *args: (gate.wait(60), write(*args))[1])
    path = saver.save(4, state, {})

    @tf.function
    def train_step():
        state[0].assign_sub(tf.ones_like(state[0]) * 10.0)
        state[0].scatter_nd_add([[0, 0]], [100.0])
        state[1].assign_add(5)

    train_step()
    assert saver.writing()
    gate.set()
    saver.wait()
    fresh = variables()
    checkpoint.restore(path, fresh)
    np.testing.assert_array_equal(fresh[0].numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert int(fresh[1].numpy()) == 3
    assert int(state[1].numpy()) == 8


def test_the_snapshot_is_host_memory_of_its_own():
    """host_snapshot holds NumPy arrays that own their buffers (no view of a variable's, which an update
    would change or TensorFlow's allocator would have to copy), with the variables' values and dtypes."""
    state = variables()
    arrays = checkpoint.host_snapshot(state)
    assert all(type(array) is np.ndarray and array.base is None for array in arrays)
    assert [array.dtype for array in arrays] == [np.float32, np.int64]
    np.testing.assert_array_equal(arrays[0], state[0].numpy())
    state[0].assign_add(tf.ones_like(state[0]))
    np.testing.assert_array_equal(arrays[0], np.arange(6, dtype=np.float32).reshape(2, 3))


def test_a_save_that_cannot_take_its_snapshot_writes_nothing_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    """Host memory running out while the snapshot is taken (on the training thread) raises there, before
    any file is opened; the checkpoint of the last save stays the newest."""
    saver = checkpoint.Checkpointer(str(tmp_path))
    state = variables()
    saver.save(1, state, {})
    saver.wait()

    def out_of_memory(values):
        raise MemoryError("host memory")

    monkeypatch.setattr(checkpoint, "host_snapshot", out_of_memory)
    with pytest.raises(MemoryError):
        saver.save(2, state, {})
    assert sorted(os.listdir(str(tmp_path))) == ["ckpt-00000001.npz"] and saver.steps() == [1]


def test_the_file_is_the_npz_numpy_writes(tmp_path):
    saver = checkpoint.Checkpointer(str(tmp_path), background=False)
    path = saver.save(2, variables(), {"note": "x"})
    with np.load(path) as ours:
        names = sorted(ours.files)
        reference = os.path.join(str(tmp_path), "reference.npz")
        np.savez(reference, **{name: ours[name] for name in names})
        with np.load(reference) as theirs:
            assert sorted(theirs.files) == names == ["__meta__", "v00000", "v00001"]
            for name in names:
                assert ours[name].dtype == theirs[name].dtype and ours[name].shape == theirs[name].shape
                np.testing.assert_array_equal(ours[name], theirs[name])


def test_a_failed_background_write_is_raised_by_wait(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    saver = checkpoint.Checkpointer(str(blocker))
    saver.save(1, variables(), {})
    with pytest.raises(OSError):
        saver.wait()


def test_save_clock_is_due_after_the_interval_since_the_last_save():
    now = [100.0]
    clock = checkpoint.SaveClock(900, clock=lambda: now[0])
    now[0] += 899
    assert clock.elapsed() == 899 and not clock.due(clock.elapsed())
    assert clock.due(900.0)  # the agreed (e.g. mean over ranks) elapsed time decides
    clock.saved()
    now[0] += 10
    assert not clock.due(clock.elapsed())
    assert not checkpoint.SaveClock(0).due(1e9)


def test_resuming_on_other_data_is_refused_unless_allowed():
    meta = {"dataset_fingerprint": "aaaa"}
    assert checkpoint.check_dataset(meta, "aaaa", False, "ckpt") is False
    with pytest.raises(checkpoint.CheckpointError, match="ckpt: was trained on dataset aaaa, this run's dataset is "
                                                         "bbbb.*allow_new_data=true"):
        checkpoint.check_dataset(meta, "bbbb", False, "ckpt")
    assert checkpoint.check_dataset(meta, "bbbb", True, "ckpt") is True
    with pytest.raises(checkpoint.CheckpointError, match="a dataset it does not record"):
        checkpoint.check_dataset({}, "bbbb", False, "ckpt")


def test_fingerprint_follows_the_tokens_not_the_statistics():
    from lm.spec import shards

    def manifest(sha="s0", documents=1):
        return shards.Manifest(dtype="uint16", seq_len=8, vocab_size=512, eod_token_id=0, tokenizer_file="t.json",
                               tokenizer_sha256="t", shards=[shards.Shard("train/0.bin", "train", 4, 72, sha)],
                               sources={"x": {"documents": documents}})
    assert shards.fingerprint(manifest()) == shards.fingerprint(manifest(documents=2))
    assert shards.fingerprint(manifest()) != shards.fingerprint(manifest(sha="s1"))


def test_dropout_masks_are_a_function_of_seed_step_and_replica():
    from controlplane.presets import get_preset
    from lm.models.gpt import build_model

    config = get_preset("tiny").replace(dropout=0.5)
    tokens = tf.constant(np.arange(16).reshape(2, 8) % 512, tf.int32)

    def logits(seed, rank, step, weights=None):
        tf.random.set_seed(len(weights or []))  # the global generator must not matter
        model = build_model(config)
        if weights is not None:
            model.set_weights(weights)
        key = checkpoint.DropoutKey(seed, rank)
        key.attach(model)
        key.count_steps_of(tf.Variable(np.int64(step)))
        return model, model(tokens, training=True).numpy()

    model, first = logits(7, 0, 5)
    weights = model.get_weights()
    np.testing.assert_array_equal(logits(7, 0, 5, weights)[1], first)  # a fresh process at the same step
    assert not np.array_equal(logits(7, 0, 6, weights)[1], first)
    assert not np.array_equal(logits(7, 1, 5, weights)[1], first)
    assert not np.array_equal(logits(8, 0, 5, weights)[1], first)
    with pytest.raises(RuntimeError, match="count_steps_of"):
        checkpoint.DropoutKey(7, 0).attach(build_model(config))(tokens, training=True)


def test_plan_expects_half_the_sooner_checkpoint_interval_lost_per_interruption():

    assert planner.lost_seconds_per_interruption(1.0, checkpoint_minutes=15, checkpoint_every=500) == 250.0
    assert planner.lost_seconds_per_interruption(10.0, checkpoint_minutes=15, checkpoint_every=500) == 450.0
    assert planner.lost_seconds_per_interruption(10.0, checkpoint_minutes=15, checkpoint_every=0) == 450.0
    assert planner.lost_seconds_per_interruption(10.0, checkpoint_minutes=0, checkpoint_every=0) is None
