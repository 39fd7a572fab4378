"""Horovod over Gloo and MWMS over gRPC, two processes on loopback, against one process.

Same global batch and seed: both ranks must end with bit-identical weights, and those must
match the single-process run up to float rounding (the all-reduce sums in another order).
"""
import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from lm.distributed.mwms import tf_config_from_sagemaker, worker_rank
from family_cases import tiny_presets

from . import helpers

STEPS = {"max_steps": 5, "global_batch_size": 8}
MODELS = dict(tiny_presets())  # preset -> its family: the smallest preset of every family (tests/family_cases.py)
DIGEST = re.compile(r"rank (\d+)/(\d+) weights sha256 ([0-9a-f]{64})")


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def digests(output):
    return {int(rank): digest for rank, size, digest in DIGEST.findall(output)}


@pytest.fixture(scope="module")
def single_runs(text_dataset, tmp_path_factory):
    """preset -> (directory, output) of one device training each preset of MODELS, one after another in one
    process."""
    directories = {preset: str(tmp_path_factory.mktemp("single")) for preset in sorted(MODELS)}
    ended = helpers.run_one_after_another([
        (helpers.cli_args(text_dataset, directory, xla=False, **run_of(preset)), {"LM_REPORT_WEIGHT_DIGEST": "1"})
        for preset, directory in directories.items()])
    assert [status for status, _ in ended] == [0] * len(MODELS), ended
    return {preset: (directory, output) for (preset, directory), (_, output) in zip(directories.items(), ended)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def single_run(single_runs, request):
    """(directory, output, preset) of the single-device run of the preset (each family's tiny one)."""
    return single_runs[request.param] + (request.param,)


def run_of(preset):
    return dict(STEPS, preset=preset, model=MODELS[preset])


def assert_matches_single(tmp, output, single_run):
    single_tmp, single_output, _ = single_run
    found = digests(output)
    assert sorted(found) == [0, 1], output
    assert found[0] == found[1], "the two ranks ended with different weights"
    ours = np.load(os.path.join(tmp, "model", "weights.npz"))
    reference = np.load(os.path.join(single_tmp, "model", "weights.npz"))
    assert ours.files == reference.files
    for key in ours.files:
        np.testing.assert_allclose(ours[key], reference[key], rtol=1e-4, atol=1e-5, err_msg=key)
    ours_losses, reference_losses = helpers.losses(output), helpers.losses(single_output)
    assert sorted(ours_losses) == sorted(reference_losses) == list(range(1, STEPS["max_steps"] + 1))
    for step, loss in reference_losses.items():
        assert ours_losses[step] == pytest.approx(loss, abs=2e-4)


HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
TWO_HOROVOD_PROCESSES = [HOROVODRUN, "--gloo", "-np", "2", "-H", "localhost:2", "--network-interface", "lo"]
# Each rank's newest checkpoint differs (rank 1's is newer, or rank 0 has none): what each is told. The processes
# of the fixtures below run it after their training runs, with a strategy of its own.
CHOOSE = ("from lm.distributed import get_strategy; s = get_strategy(%r).setup(); "
          "print('rank %%d chose %%s, then %%s' %% (s.rank, s.choose_checkpoint([4, 6][s.rank]), "
          "s.choose_checkpoint([None, 6][s.rank])))")
CHOSEN = re.compile(r"rank (\d) chose (\w+), then (\w+)")
RANK_0S_CHOICE = [("0", "4", "None"), ("1", "4", "None")]


@pytest.fixture(scope="module")
def horovod_processes(text_dataset, tmp_path_factory):
    """(preset -> (directory, [(exit status, output)] of rank 0 and rank 1), the output of both) of two Horovod
    processes that train each preset of MODELS one after another, then run CHOOSE: one TensorFlow start-up per
    rank for all of it."""
    directories = {preset: str(tmp_path_factory.mktemp("horovod")) for preset in sorted(MODELS)}
    runs = [(helpers.cli_args(text_dataset, directory, strategy="horovod", xla=False, **run_of(preset)), {})
            for preset, directory in directories.items()]
    result = subprocess.run(TWO_HOROVOD_PROCESSES + helpers.one_after_another_command(runs, then=CHOOSE % "horovod"),
                            env=helpers.environment(LM_REPORT_WEIGHT_DIGEST="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=600)
    assert result.returncode == 0, result.stdout
    ranks = [helpers.ended_runs(output, len(runs)) for output in helpers.rank_outputs(result.stdout)]
    assert len(ranks) == 2, result.stdout
    return ({preset: (directory, [rank[index] for rank in ranks])
             for index, (preset, directory) in enumerate(directories.items())}, result.stdout)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(HOROVODRUN), reason="horovod is not installed in this environment")
def test_horovod_gloo_two_processes_match_one(horovod_processes, single_run):
    tmp, ranks = horovod_processes[0][single_run[2]]
    assert [status for status, _ in ranks] == [0, 0], ranks
    assert_matches_single(tmp, "".join(output for _, output in ranks), single_run)


@pytest.fixture(scope="module")
def mwms_workers(text_dataset, tmp_path_factory):
    """(preset -> (directory, [(exit status, output)] of each worker's run, the same of each worker's restart), the
    output of each worker) of two MWMS workers on loopback that train each preset of MODELS, then restart each,
    one after another, then run CHOOSE: one TensorFlow start-up per worker for all of it (a new strategy each)."""
    directories = {preset: str(tmp_path_factory.mktemp("mwms")) for preset in sorted(MODELS)}
    workers = ["127.0.0.1:%d" % port for port in free_ports(2)]
    processes = []
    for index in range(2):
        # Each worker its own checkpoint directory (as each host has): only the chief may write.
        runs = [(helpers.cli_args(text_dataset, os.path.join(directory, "w%d" % index), strategy="mwms", xla=False,
                                  **run_of(preset)), {}) for preset, directory in directories.items()]
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = helpers.environment(LM_REPORT_WEIGHT_DIGEST="1", TF_CONFIG=json.dumps(tf_config))
        processes.append(subprocess.Popen(helpers.one_after_another_command(runs + runs, then=CHOOSE % "mwms"),
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output
    workers_runs = [helpers.ended_runs(output, 2 * len(directories)) for output in outputs]
    return ({preset: (directory, [runs[index] for runs in workers_runs],
                      [runs[len(directories) + index] for runs in workers_runs])
             for index, (preset, directory) in enumerate(directories.items())}, outputs)


@pytest.mark.slow
def test_mwms_two_workers_on_loopback_match_one(mwms_workers, single_run):
    tmp, workers, restarted = mwms_workers[0][single_run[2]]
    outputs = [output for _, output in workers]
    assert [status for status, _ in workers] == [0, 0], outputs
    assert not os.path.exists(os.path.join(tmp, "w1", "model")), "only the chief exports"
    other_checkpoints = os.path.join(tmp, "w1", "ckpt")
    assert not os.path.isdir(other_checkpoints) or not os.listdir(other_checkpoints), "only the chief saves"
    assert "[train]" not in outputs[1], "only the chief logs metrics"
    assert_matches_single(os.path.join(tmp, "w0"), outputs[0] + outputs[1], single_run)

    # A restart: the chief chooses its newest checkpoint (step 5); worker 1's directory lacks it,
    # so both workers fail at once, before step 1, each saying why.
    outputs = [output for _, output in restarted]
    assert [status for status, _ in restarted] == [2, 2], outputs
    assert "ckpt-00000005.npz: not found on rank 1, but the run resumes from step 5" in outputs[1]
    assert "the checkpoint of step 5 (rank 0's newest) is missing on 1 of 2 ranks" in outputs[0]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(HOROVODRUN), reason="horovod is not installed in this environment")
def test_horovod_ranks_resume_from_the_step_rank_0_chooses(horovod_processes):
    output = horovod_processes[1]
    assert sorted(CHOSEN.findall(output)) == RANK_0S_CHOICE, output


@pytest.mark.slow
def test_mwms_workers_resume_from_the_step_the_chief_chooses(mwms_workers):
    outputs = mwms_workers[1]
    assert sorted(CHOSEN.findall("".join(outputs))) == RANK_0S_CHOICE, outputs


def test_mwms_refuses_a_worker_batch_its_gpus_cannot_split_evenly():
    from controlplane import presets
    from lm.compat import tf
    from lm.distributed.mwms import MultiWorkerMirroredStrategy, local_split_problem
    from lm.training import train

    message = "a worker's 6 sequences (global_batch_size / 2 workers) do not split evenly over its 4 GPUs"
    assert local_split_problem(6, 2, 4) == message and local_split_problem(8, 2, 4) is None
    # The runtime: a worker with 4 local replicas (as on a 4-GPU host) refuses a batch of 6, which
    # floor division would cut to 4, before it runs the step.
    strategy = MultiWorkerMirroredStrategy()  # not set up: the check comes before any TensorFlow work
    strategy.size, strategy.local_replicas = 2, 4
    batch = tf.zeros([6, 4], tf.int32)
    for step in (strategy.build_train_step(None, None, None), strategy.build_eval_step(None, None)):
        with pytest.raises(ValueError) as refused:
            step(batch, batch)
        assert str(refused.value) == message
    # The dry run says the same, from the same function.
    hp, paths = train.parse_args(["--dry-run", "--strategy", "mwms", "--global_batch_size", "12",
                                  "--instance-type", "ml.g5.12xlarge", "--instance-count", "2"]
                                 + presets.train_arguments("tiny"))
    with pytest.raises(train.UsageError) as refused:
        train.dry_run(hp, paths)
    assert str(refused.value) == message


def test_tf_config_is_built_from_the_sagemaker_hosts():
    environ = {"SM_HOSTS": '["algo-1", "algo-2"]', "SM_CURRENT_HOST": "algo-2"}
    assert tf_config_from_sagemaker(environ) == {
        "cluster": {"worker": ["algo-1:2222", "algo-2:2222"]}, "task": {"type": "worker", "index": 1}}
    environ["LM_HOST_ADDRESSES"] = '{"algo-1": "127.0.0.1:5001", "algo-2": "127.0.0.1:5002"}'
    assert tf_config_from_sagemaker(environ)["cluster"]["worker"] == ["127.0.0.1:5001", "127.0.0.1:5002"]
    assert tf_config_from_sagemaker({}) is None
    with pytest.raises(ValueError, match="SM_CURRENT_HOST 'algo-3' is not in SM_HOSTS"):
        tf_config_from_sagemaker({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-3"})


def test_worker_rank_counts_a_chief_task_first():
    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    assert worker_rank({"cluster": cluster, "task": {"type": "chief", "index": 0}}) == (0, 3)
    assert worker_rank({"cluster": cluster, "task": {"type": "worker", "index": 1}}) == (2, 3)
