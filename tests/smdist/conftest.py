"""Tests of the SMDDP and SMP adapters against FAKES of the smdistributed libraries.

The real libraries run only in AWS's GPU DLCs; tests/fakes holds fakes that implement only
documented calls and record them (see tests/fakes/README.md).
"""
import pytest

from lm.compat import tf
from smdist_helpers import faked_smdist

# The machine is shared: keep TensorFlow to a couple of threads.
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(2)  # a step barrier per rank (2 ranks)


@pytest.fixture
def fake_smdist(monkeypatch):
    """The fake `smdistributed` package on sys.path, with an empty call log and nothing initialized."""
    with faked_smdist(monkeypatch) as smdistributed:
        yield smdistributed
