"""lm.training.summaries: rank 0's tf.summary scalars, read back from the event files as TensorBoard reads them."""
import glob
import os

import pytest

from lm.spec import contract, job
from lm.training import summaries
from lm.compat import tf


def read_scalars(directory):
    """{tag: [(step, value)]} from every event file in `directory` (tf.compat.v1.train.summary_iterator)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return found


def test_scalars_read_back_with_their_steps(tmp_path):
    directory = str(tmp_path / "tb")
    writer = summaries.Summaries(directory, enabled=True)
    writer.train(10, loss=3.5, learning_rate=6e-4, grad_norm=1.25, tokens_per_s=1000.0, mfu=0.4, loss_scale=1.0)
    writer.train(20, loss=3.0, learning_rate=5e-4, grad_norm=1.0, tokens_per_s=1100.0, mfu=0.41, loss_scale=2.0)
    writer.validation(20, 3.25)
    scalars = read_scalars(directory)  # flushed at every call: readable before close, as SageMaker uploads it
    writer.close()
    assert scalars["train/loss"] == [(10, 3.5), (20, 3.0)]
    assert scalars["train/loss_scale"] == [(10, 1.0), (20, 2.0)]
    assert scalars["train/learning_rate"][0] == (10, pytest.approx(6e-4))
    assert scalars["validation/loss"] == [(20, 3.25)]
    assert sorted(scalars) == sorted(["train/%s" % tag for tag in summaries.TRAIN_TAGS] + ["validation/loss"])


def test_other_ranks_and_no_directory_write_nothing(tmp_path):
    summaries.Summaries(str(tmp_path / "rank1"), enabled=False).train(1, loss=1.0)
    summaries.Summaries(None, enabled=True).train(1, loss=1.0)
    assert not os.path.exists(str(tmp_path / "rank1"))


def test_unknown_scalar_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown training summaries accuracy; allowed: loss, learning_rate"):
        summaries.Summaries(str(tmp_path), enabled=True).train(1, accuracy=1.0)


def test_default_directory_is_sagemakers_tensorboard_path():
    assert summaries.default_directory(True, {}) == contract.TENSORBOARD_LOCAL_PATH == "/opt/ml/output/tensorboard"
    assert summaries.default_directory(True, {"SAGEMAKER_BASE_DIR": "/tmp/host"}) == "/tmp/host/output/tensorboard"
    assert summaries.default_directory(False, {}) is None


def test_events_carry_what_tensorboards_scalars_plugin_reads(tmp_path):
    writer = summaries.Summaries(str(tmp_path), enabled=True)
    writer.train(1, loss=2.0)
    writer.close()
    path = glob.glob(os.path.join(str(tmp_path), "events.out.tfevents.*"))[0]
    values = [value for event in tf.compat.v1.train.summary_iterator(path) for value in event.summary.value]
    assert values[0].metadata.plugin_data.plugin_name == "scalars"
    assert values[0].metadata.data_class == summaries.DATA_CLASS_SCALAR


def test_the_goodput_totals_are_scalars_and_unknown_ones_are_refused(tmp_path):
    directory = str(tmp_path / "tb")
    writer = summaries.Summaries(directory, enabled=True)
    totals = {name: float(index) for index, name in enumerate(job.GOODPUT_TOTALS)}
    writer.goodput(40, totals)
    scalars = read_scalars(directory)
    with pytest.raises(ValueError, match="unknown goodput totals dollars; allowed: kept_steps, kept_tokens"):
        writer.goodput(40, dict(totals, dollars=1.0))
    writer.close()
    assert scalars == {"goodput/%s" % name: [(40, value)] for name, value in totals.items()}
