"""Tests of the SMDDP and SMP adapters against FAKES of the smdistributed libraries.

The real libraries run only in AWS's GPU DLCs; tests/fakes holds fakes that implement only
documented calls and record them (see tests/fakes/README.md).
"""
import importlib
import os

import pytest

from lm.compat import tf

# The machine is shared: keep TensorFlow to a couple of threads.
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(2)  # a step barrier per rank (2 ranks)

FAKES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes")
FAKE_ENV = ("FAKE_SDP_RANK", "FAKE_SDP_SIZE", "FAKE_SDP_LOCAL_RANK", "FAKE_SDP_LOCAL_SIZE", "FAKE_SDP_RENDEZVOUS",
            "FAKE_SMP_RANK", "FAKE_SMP_SIZE", "FAKE_SMP_LOCAL_SIZE", "FAKE_SMP_TIMEOUT", "FAKE_SMDIST_LOG",
            "SM_HP_MP_PARAMETERS")


@pytest.fixture
def fake_smdist(monkeypatch):
    """The fake `smdistributed` package on sys.path, with an empty call log and nothing initialized."""
    monkeypatch.syspath_prepend(FAKES)
    for name in FAKE_ENV:
        monkeypatch.delenv(name, raising=False)
    import smdistributed
    sdp = importlib.import_module("smdistributed.dataparallel.tensorflow")
    smp = importlib.import_module("smdistributed.modelparallel.tensorflow")
    assert "fakes" in smdistributed.__file__, "tests must run against the fakes"
    smdistributed.reset()
    sdp._state["initialized"] = False
    smp.reset()
    yield smdistributed
    smdistributed.reset()


