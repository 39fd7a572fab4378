"""The SMDDP adapter against the FAKE smdistributed.dataparallel (tests/fakes)."""
import numpy as np
import pytest

from lm.distributed import get_strategy
from smdist_helpers import train


def test_setup_inits_once_takes_ranks_and_pins_the_local_gpu(fake_smdist, monkeypatch):
    monkeypatch.setenv("FAKE_SDP_RANK", "5")
    monkeypatch.setenv("FAKE_SDP_SIZE", "8")
    monkeypatch.setenv("FAKE_SDP_LOCAL_SIZE", "4")
    pinned = []
    monkeypatch.setattr("lm.distributed.smddp.pin_gpu", pinned.append)
    strategy = get_strategy("smddp").setup()
    assert fake_smdist.names() == ["sdp.init"]
    assert (strategy.rank, strategy.size, strategy.local_rank, strategy.local_size) == (5, 8, 1, 4)
    assert (strategy.data_parallel_rank, strategy.data_parallel_size) == (5, 8)
    assert pinned == [1]
    assert not strategy.is_chief and not strategy.writes_checkpoints


def test_only_rank_zero_writes(fake_smdist, monkeypatch):
    monkeypatch.setenv("FAKE_SDP_SIZE", "2")
    strategy = get_strategy("smddp").setup()
    assert strategy.is_chief and strategy.writes_checkpoints


@pytest.mark.slow
def test_trains_through_distributed_tape_like_one_device(fake_smdist):
    strategy = get_strategy("smddp").setup()
    model, optimizer, losses = train(strategy, steps=3)
    names = fake_smdist.names()
    assert names.count("sdp.init") == 1
    # The tape is wrapped once (at trace) and every gradient goes through its all-reduce.
    assert names.count("sdp.DistributedGradientTape") == 1
    gradient_call = dict(fake_smdist.calls)["sdp.DistributedGradientTape.gradient"]
    assert gradient_call["count"] == len(model.trainable_variables)
    reduced = [details for name, details in fake_smdist.calls if name == "sdp.allreduce"]
    assert [d["param_index"] for d in reduced[:gradient_call["count"]]] == list(range(gradient_call["count"]))
    # Model, then optimizer state, broadcast from rank 0 once, after the first step's trace.
    broadcasts = [(index, details) for index, (name, details) in enumerate(fake_smdist.calls)
                  if name == "sdp.broadcast_variables"]
    assert [d["count"] for _, d in broadcasts] == [len(model.variables), len(optimizer.variables)]
    assert all(d["root_rank"] == 0 for _, d in broadcasts)
    assert broadcasts[0][0] > names.index("sdp.DistributedGradientTape.gradient")

    single_model, _, single_losses = train(get_strategy("single").setup(), steps=3)
    np.testing.assert_allclose(losses, single_losses, rtol=1e-5)
    for ours, reference in zip(model.get_weights(), single_model.get_weights()):
        np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5)
    assert losses[-1] < losses[0]
