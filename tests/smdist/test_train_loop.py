"""`python -m lm.training.train --strategy smddp|smp` through the training loop, against the FAKE
smdistributed libraries (tests/fakes; not AWS's libraries) on a tiny random-token dataset. SMP
jobs run their ranks as threads of one process (`smdistributed.modelparallel.run`)."""
import json
import os

import pytest

from controlplane import presets
from lm.spec import job
from smdist_helpers import run_jobs, train_arguments, write_random_dataset
from checkpoint_listing import checkpoint_files

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_random_dataset(str(tmp_path_factory.mktemp("random_dataset")))


def _files(out_dir, sub):
    path = os.path.join(out_dir, sub)
    return checkpoint_files(path) if os.path.isdir(path) else []


def _trained(output, steps):
    logged = [line for line in output.splitlines() if line.startswith(job.TRAIN_LOG_PREFIX)]
    return [int(line.split("step=")[1].split()[0]) for line in logged] == list(range(1, steps + 1))


def test_smddp_rank_0_trains_checkpoints_and_exports(later_jobs):
    out, (status, output, calls) = later_jobs["smddp"]
    assert status == 0, output
    assert _trained(output, 3)
    names = [call["call"] for call in calls]
    assert names.count("sdp.init") == 1 and names[0] == "sdp.init"
    assert names.count("sdp.DistributedGradientTape") == 1
    broadcasts = [index for index, name in enumerate(names) if name == "sdp.broadcast_variables"]
    assert len(broadcasts) == 2 and broadcasts[0] > names.index("sdp.DistributedGradientTape.gradient")
    assert _files(out, "ckpt") == ["ckpt-00000002.npz", "ckpt-00000003.npz"]
    assert "model.json" in _files(out, "model")
    assert names[-1] == "sdp.shutdown"


# The FAKE SMP job: two ranks (threads of one process), one partition each (manual placement).
MP = json.dumps({"partitions": 2, "microbatches": 2, "pipeline": "interleaved", "optimize": "speed",
                 "auto_partition": False, "default_partition": 0})
# grad_clip 0.05: every step clips, by the norm of the whole model.
SMP_RUN = dict(steps=4, grad_clip=0.05)


# The module's jobs run in two processes, each paying one TensorFlow start-up: the tf26-marked tests' jobs
# (first_jobs), then the others' (later_jobs), which may start from the first's files.
def _jobs(tmp_path_factory, jobs):
    """{name: (out dir, (exit status, output, calls))} of `jobs` ({name: run_train's arguments, the out dir a new
    one where none is given}), run one after another in one process."""
    outs = {name: job.get("out_dir") or str(tmp_path_factory.mktemp(name)) for name, job in jobs.items()}
    ended = run_jobs([dict(job, out_dir=outs[name]) for name, job in jobs.items()])
    return {name: (outs[name], result) for name, result in zip(jobs, ended)}


@pytest.fixture(scope="module")
def first_jobs(dataset, tmp_path_factory):
    return _jobs(tmp_path_factory, {
        "two_partitions": dict(data_dir=dataset, strategy="smp", env={"SM_HP_MP_PARAMETERS": MP}, ranks=2,
                               **SMP_RUN),
        "divergence": dict(data_dir=dataset, strategy="smp", env={"SM_HP_MP_PARAMETERS": MP,
                                                                  "LMSTACK_FAULTS": "nan@5,spike@20:3"},
                           ranks=2, steps=26, rollback_skip=4)})


@pytest.fixture(scope="module")
def two_partition_run(first_jobs):
    """One uninterrupted 2-partition run of 4 steps (checkpoints at 2 and 4): (out dir, output, calls)."""
    out, (status, output, calls) = first_jobs["two_partitions"]
    assert status == 0, output
    return out, output, calls


@pytest.mark.tf26
def test_smp_trains_in_microbatches_checkpoints_per_partition_and_exports(two_partition_run):
    out, output, calls = two_partition_run
    assert _trained(output, 4)
    names = [call["call"] for call in calls]
    assert names.count("smp.init") == 2 and names[:2] == ["smp.init"] * 2
    train_steps = [call["details"] for call in calls
                   if call["call"] == "smp.step" and call["details"]["function"] == "forward_backward"]
    assert train_steps and train_steps[0]["shapes"] == {"inputs": [4, 16], "labels": [4, 16]}
    assert {details["rank"] for details in train_steps} == {0, 1}
    # Every partition saves through smp.CheckpointManager, into one directory per step, which
    # rank 0 marks complete; only the newest two are kept.
    saves = [(call["details"]["rank"], os.path.basename(call["details"]["directory"])) for call in calls
             if call["call"] == "smp.CheckpointManager.save"]
    assert sorted(saves) == [(0, "smp-00000002"), (0, "smp-00000004"), (1, "smp-00000002"), (1, "smp-00000004")]
    assert _files(out, "ckpt") == ["smp-00000002", "smp-00000004"]
    assert "complete.json" in _files(out, "ckpt/smp-00000004")
    assert "model.json" in _files(out, "model")


def _interrupt_the_save_of_step_4(reference_out, out, marked):
    """The reference run's checkpoints under `out`, as if the job was stopped while saving step 4:
    partition 0 wrote its files, partition 1 did not, and rank 0 never marked the step complete. Or
    (marked) S3 brought the save back without partition 1's file: the library's restore() then only
    warns "No checkpoints restored." and partition 1 would train on from fresh weights. (The fake's
    own layout, read by this test only.)"""
    import shutil

    shutil.copytree(os.path.join(reference_out, "ckpt"), os.path.join(out, "ckpt"))
    partial = os.path.join(out, "ckpt", "smp-00000004")
    if marked:
        files = os.path.join(partial, "fake-partition-1")
        os.remove(os.path.join(files, [name for name in os.listdir(files) if name.endswith(".pickle")][0]))
    else:
        os.remove(os.path.join(partial, "complete.json"))
        shutil.rmtree(os.path.join(partial, "fake-partition-1"))


@pytest.fixture(scope="module")
def later_jobs(dataset, tmp_path_factory, two_partition_run):
    smp = dict(data_dir=dataset, strategy="smp", **SMP_RUN)
    resumed = {}
    for marked in (False, True):
        out = str(tmp_path_factory.mktemp("resumed"))
        _interrupt_the_save_of_step_4(two_partition_run[0], out, marked)
        resumed["resumed, marked" if marked else "resumed"] = dict(smp, out_dir=out, env={"SM_HP_MP_PARAMETERS": MP},
                                                                   ranks=2)
    return _jobs(tmp_path_factory, dict(resumed, **{
        "smddp": dict(data_dir=dataset, strategy="smddp", env={"FAKE_SDP_SIZE": "1"}),
        "one_partition": dict(smp, env={"SM_HP_MP_PARAMETERS": json.dumps({"partitions": 1, "microbatches": 2})},
                              ranks=1),
        # The fake's allreduce inside a tf.function holds an inter-op thread per rank: run_jobs gives the
        # process one per rank of its largest job.
        "two_replicas": dict(smp, env={"SM_HP_MP_PARAMETERS": json.dumps(dict(json.loads(MP), horovod=True))},
                             ranks=4)}))


def _assert_same_weights(export, reference_export):
    import numpy as np

    from lm.serving.server import ExportedModel
    served, reference = ExportedModel(export), ExportedModel(reference_export)
    ours, theirs = served.generator.model.get_weights(), reference.generator.model.get_weights()
    assert len(ours) == len(theirs) == len(reference.generator.model.weights)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    return served, reference


def test_smp_export_of_two_partitions_loads_in_lm_serve_and_equals_one_partition(two_partition_run, later_jobs):
    one_partition, (status, output, _) = later_jobs["one_partition"]
    assert status == 0, output
    served, reference = _assert_same_weights(os.path.join(two_partition_run[0], "model"),
                                             os.path.join(one_partition, "model"))
    assert served.generate(["a b"], max_new_tokens=2, temperature=0.0) == reference.generate(
        ["a b"], max_new_tokens=2, temperature=0.0)


def test_smp_two_replicas_with_horovod_train_checkpoint_and_export_like_one_replica(later_jobs, two_partition_run):
    """FAKE SMP + its fake Horovod under the thread ranks (not AWS's library, not Horovod): 4 ranks of
    2 partitions with "horovod": true (smd_model_parallel_general: "Must be set to True if hybrid
    model/data parallelism is used and the data parallelism (DP) framework is Horovod") are 2 replicas, each on half of the global batch, whose
    gradients hvd.allreduce averages over the dp group ("Ranking Basics"). lm.training.train ends with the
    weights of the 1-replica run on the same global batches; only the first replica saves."""
    out, (status, output, calls) = later_jobs["two_replicas"]
    assert status == 0, output
    assert _trained(output, 4)
    names = [call["call"] for call in calls]
    assert names.count("smp.init") == 4 and "hvd.init" not in names
    # Model, then optimizer state, from dp rank 0 to every replica, once per rank.
    broadcasts = [(call["details"]["rank"], call["details"]["dp_group"]) for call in calls
                  if call["call"] == "hvd.broadcast_variables"]
    assert sorted(broadcasts) == [(0, [0, 2]), (0, [0, 2]), (1, [1, 3]), (1, [1, 3]), (2, [0, 2]), (2, [0, 2]),
                                  (3, [1, 3]), (3, [1, 3])]
    saves = sorted({call["details"]["rank"] for call in calls if call["call"] == "smp.CheckpointManager.save"})
    assert saves == [0, 1]
    _assert_same_weights(os.path.join(out, "model"), os.path.join(two_partition_run[0], "model"))


@pytest.mark.parametrize("marked", [False, True], ids=["unmarked", "marked, a partition's file missing"])
def test_smp_run_interrupted_in_a_save_resumes_from_the_last_complete_step_and_ends_like_one_run(
        later_jobs, two_partition_run, marked):
    # The run started from the checkpoints _interrupt_the_save_of_step_4 left.
    reference_out = two_partition_run[0]
    out, (status, output, calls) = later_jobs["resumed, marked" if marked else "resumed"]
    assert status == 0, output
    assert "at step 2" in output and _trained_from(output, 3, 4)
    restores = sorted((call["details"]["rank"], os.path.basename(call["details"]["directory"]),
                       bool(call["details"]["restored"])) for call in calls
                      if call["call"] == "smp.CheckpointManager.restore")
    assert restores == [(0, "smp-00000002", True), (1, "smp-00000002", True)]
    # Both ranks trained steps 3 and 4, and the weights are those of the uninterrupted run.
    train_steps = [call["details"]["rank"] for call in calls
                   if call["call"] == "smp.step" and call["details"]["function"] == "forward_backward"]
    assert train_steps.count(0) == train_steps.count(1) == 2
    _assert_same_weights(os.path.join(out, "model"), os.path.join(reference_out, "model"))
    assert _files(out, "ckpt") == ["smp-00000002", "smp-00000004"]
    assert "complete.json" in _files(out, "ckpt/smp-00000004")


def test_smp_dry_run_checks_the_newest_complete_smp_checkpoint(dataset, two_partition_run, capsys):
    from lm.training import train
    directory = os.path.join(two_partition_run[0], "ckpt")
    arguments = ["--dry-run", *presets.train_arguments("tiny"), "--strategy", "smp", "--global_batch_size", "8",
                 "--mp_parameters", json.dumps({"partitions": 2, "microbatches": 2, "horovod": True,
                                                   "auto_partition": False, "default_partition": 0}),
                 "--instance-type", "ml.p3.16xlarge", "--instance-count", "1", "--data-dir", dataset,
                 "--checkpoint-dir", directory]
    assert train.main(arguments + ["--seed", "7"]) == 0
    assert "checkpoint %s" % os.path.join(directory, "smp-00000004") in capsys.readouterr().out
    assert train.main(arguments + ["--seed", "8"]) == 2
    assert "smp-00000004: was written with hyperparameters.seed=7, this run has 8" in capsys.readouterr().err


def _trained_from(output, first, last):
    logged = [line for line in output.splitlines() if line.startswith(job.TRAIN_LOG_PREFIX)]
    return [int(line.split("step=")[1].split()[0]) for line in logged] == list(range(first, last + 1))


def test_smp_bad_mp_parameters_exit_with_the_field_named(dataset, tmp_path, fake_smdist, monkeypatch, capsys):
    from lm.training import train
    monkeypatch.setenv("SM_HP_MP_PARAMETERS", json.dumps({"partitions": 2, "pipeline": "fast"}))
    status = train.main(train_arguments(dataset, str(tmp_path), "smp"))
    captured = capsys.readouterr()
    assert status != 0
    assert "mp_parameters.pipeline must be one of simple, interleaved, got 'fast'" in captured.out + captured.err
    assert fake_smdist.calls == []


@pytest.mark.tf26
def test_smp_skips_a_nan_step_and_rolls_a_spike_back_on_every_partition(first_jobs):
    """lm.training.divergence under SMP: the decision is on the pipeline's reduced loss, so both partitions
    skip the same step; a spike restores every partition's save from before it and skips its batches."""
    out, (status, output, calls) = first_jobs["divergence"]
    assert status == 0, output
    assert "[divergence] skipped step=5 epoch=0 batch=4 skipped_steps=1" in output
    assert ("a loss spike from step 20 to step 22: restored the checkpoint of step 18, skipping batches 18-21"
            in output), output
    restores = [(call["details"]["rank"], os.path.basename(call["details"]["directory"])) for call in calls
                if call["call"] == "smp.CheckpointManager.restore"]
    assert sorted(restores) == [(0, "smp-00000018"), (1, "smp-00000018")]
    assert _files(out, "ckpt") == ["smp-00000024", "smp-00000026"]
    assert "[divergence] summary step=26 epoch=0 batch=29 skipped_steps=1 rollbacks=1" in output
