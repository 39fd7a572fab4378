"""`python -m lm.train --strategy smddp|smp` through the training loop, against the FAKE
smdistributed libraries (tests/fakes; not AWS's libraries) on a tiny random-token dataset. SMP
jobs run their ranks as threads of one process (`smdistributed.modelparallel.run`)."""
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


# The FAKE SMP job: two ranks (threads of one process), one partition each (manual placement).
MP = json.dumps({"partitions": 2, "microbatches": 2, "pipeline": "interleaved", "optimize": "speed",
                 "auto_partition": False, "default_partition": 0})


def test_smp_trains_in_microbatches_checkpoints_per_partition_and_exports(dataset, tmp_path):
    status, output, calls = run_train(dataset, str(tmp_path), "smp", {"SM_HP_MP_PARAMETERS": MP}, ranks=2)
    assert status == 0, output
    assert _trained(output, 3)
    names = [call["call"] for call in calls]
    assert names.count("smp.init") == 2 and names[:2] == ["smp.init"] * 2
    train_steps = [call["details"] for call in calls
                   if call["call"] == "smp.step" and call["details"]["function"] == "forward_backward"]
    assert train_steps and train_steps[0]["shapes"] == {"inputs": [4, 16], "labels": [4, 16]}
    assert {details["rank"] for details in train_steps} == {0, 1}
    assert _files(str(tmp_path), "ckpt") == ["ckpt-00000002mp0.npz", "ckpt-00000002mp1.npz",
                                             "ckpt-00000003mp0.npz", "ckpt-00000003mp1.npz"]
    assert "model.json" in _files(str(tmp_path), "model")


@pytest.fixture(scope="module")
def one_partition_export(dataset, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("one_partition"))
    status, output, _ = run_train(dataset, out, "smp", {"SM_HP_MP_PARAMETERS": json.dumps(
        {"partitions": 1, "microbatches": 2})}, ranks=1, grad_clip=0.05)
    assert status == 0, output
    return os.path.join(out, "model")


def test_smp_export_of_two_partitions_loads_in_lm_serve_and_equals_one_partition(dataset, tmp_path,
                                                                                one_partition_export):
    import numpy as np

    from lm.serve import ExportedModel
    # grad_clip 0.05: every step clips, by the norm of the whole model.
    status, output, _ = run_train(dataset, str(tmp_path), "smp", {"SM_HP_MP_PARAMETERS": MP}, ranks=2,
                                  grad_clip=0.05)
    assert status == 0, output
    served = ExportedModel(os.path.join(str(tmp_path), "model"))
    reference = ExportedModel(one_partition_export)
    ours, theirs = served.generator.model.get_weights(), reference.generator.model.get_weights()
    assert len(ours) == len(theirs) == len(reference.generator.model.weights)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert served.generate(["a b"], max_new_tokens=2, temperature=0.0) == reference.generate(
        ["a b"], max_new_tokens=2, temperature=0.0)


def test_smp_ranks_resume_from_the_step_rank_0_chooses(dataset, tmp_path):
    status, output, _ = run_train(dataset, str(tmp_path), "smp", {"SM_HP_MP_PARAMETERS": MP}, ranks=2)
    assert status == 0, output
    # Partition 0's write of step 3 never finished; partition 1's did.
    os.remove(os.path.join(str(tmp_path), "ckpt", "ckpt-00000003mp0.npz"))
    os.remove(os.path.join(str(tmp_path), "calls.jsonl"))
    status, output, calls = run_train(dataset, str(tmp_path), "smp", {"SM_HP_MP_PARAMETERS": MP}, steps=4, ranks=2)
    assert status == 0, output
    assert "at step 2" in output and _trained_from(output, 3, 4)
    # Both ranks trained steps 3 and 4 (resuming rank 1 from its own newest, step 3, would
    # leave rank 0 waiting in a collective: the fake raises on such a hang).
    train_steps = [call["details"]["rank"] for call in calls
                   if call["call"] == "smp.step" and call["details"]["function"] == "forward_backward"]
    assert train_steps.count(0) == train_steps.count(1) == 2


def _trained_from(output, first, last):
    logged = [line for line in output.splitlines() if line.startswith(job.TRAIN_LOG_PREFIX)]
    return [int(line.split("step=")[1].split()[0]) for line in logged] == list(range(first, last + 1))


def test_smp_bad_mp_parameters_exit_with_the_field_named(dataset, tmp_path):
    status, output, calls = run_train(dataset, str(tmp_path), "smp", {
        "SM_HP_MP_PARAMETERS": json.dumps({"partitions": 2, "pipeline": "fast"})})
    assert status != 0
    assert "mp_parameters.pipeline must be one of simple, interleaved, got 'fast'" in output
    assert calls == []
