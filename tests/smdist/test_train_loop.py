"""`python -m lm.train --strategy smddp|smp` through the training loop, against the FAKE
smdistributed libraries (tests/fakes) on a tiny random-token dataset."""
import json
import os

import pytest

from lm import job
from smdist_helpers import run_train, write_random_dataset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_random_dataset(str(tmp_path_factory.mktemp("random_dataset")))


def _files(out_dir, sub):
    path = os.path.join(out_dir, sub)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def _trained(output, steps):
    logged = [line for line in output.splitlines() if line.startswith(job.TRAIN_LOG_PREFIX)]
    return [int(line.split("step=")[1].split()[0]) for line in logged] == list(range(1, steps + 1))


def test_smddp_rank_0_trains_checkpoints_and_exports(dataset, tmp_path):
    status, output, calls = run_train(dataset, str(tmp_path), "smddp", {"FAKE_SDP_SIZE": "1"})
    assert status == 0, output
    assert _trained(output, 3)
    names = [call["call"] for call in calls]
    assert names.count("sdp.init") == 1 and names[0] == "sdp.init"
    assert names.count("sdp.DistributedGradientTape") == 1
    broadcasts = [index for index, name in enumerate(names) if name == "sdp.broadcast_variables"]
    assert len(broadcasts) == 2 and broadcasts[0] > names.index("sdp.DistributedGradientTape.gradient")
    assert _files(str(tmp_path), "ckpt") == ["ckpt-00000002.npz", "ckpt-00000003.npz"]
    assert "model.json" in _files(str(tmp_path), "model")
    assert names[-1] == "sdp.shutdown"


MP = json.dumps({"partitions": 2, "microbatches": 2, "pipeline": "interleaved", "optimize": "speed", "horovod": True})


def test_smp_trains_in_microbatches_checkpoints_per_partition_and_exports(dataset, tmp_path):
    status, output, calls = run_train(dataset, str(tmp_path), "smp", {"SM_HP_MP_PARAMETERS": MP})
    assert status == 0, output
    assert _trained(output, 3)
    names = [call["call"] for call in calls]
    assert names.count("smp.init") == 1 and names[0] == "smp.init"
    train_steps = [call["details"] for call in calls
                   if call["call"] == "smp.step" and call["details"]["function"] == "forward_backward"]
    assert train_steps and train_steps[0]["shapes"] == {"inputs": [4, 16], "labels": [4, 16]}
    assert _files(str(tmp_path), "ckpt") == ["ckpt-00000002mp0.npz", "ckpt-00000003mp0.npz"]
    assert "model.json" in _files(str(tmp_path), "model")


def test_smp_second_replica_writes_nothing(dataset, tmp_path):
    # Rank 2 of 4 with 2 partitions: partition 0 of replica 1 (the writers are replica 0's ranks).
    status, output, calls = run_train(dataset, str(tmp_path), "smp", {
        "SM_HP_MP_PARAMETERS": MP, "FAKE_SMP_RANK": "2", "FAKE_SMP_SIZE": "4"})
    assert status == 0, output
    assert "smp.step" in [call["call"] for call in calls]
    assert _files(str(tmp_path), "ckpt") == [] and _files(str(tmp_path), "model") == []


def test_smp_bad_mp_parameters_exit_with_the_field_named(dataset, tmp_path):
    status, output, calls = run_train(dataset, str(tmp_path), "smp", {
        "SM_HP_MP_PARAMETERS": json.dumps({"partitions": 2, "pipeline": "fast"})})
    assert status != 0
    assert "mp_parameters.pipeline must be one of simple, interleaved, got 'fast'" in output
    assert calls == []
