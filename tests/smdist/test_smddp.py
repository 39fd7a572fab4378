"""The SMDDP adapter, and the FAKE `smdistributed.dataparallel.tensorflow` it runs against here.

The fake (tests/fakes/smdistributed/dataparallel) is not AWS's library. It follows the
library's TensorFlow API page, "TensorFlow Guide to SageMaker's distributed data parallel
library" (https://sagemaker.readthedocs.io/en/stable/api/training/sdp_versions/latest/smd_data_parallel_tensorflow.html),
and SageMaker Python SDK pull request #2346 (`sparse_as_dense` converts `tf.IndexedSlices`):
ranks are processes that reduce real values through a directory they share, and it raises on
calls, arguments and values the page does not list.

Tests with several ranks run this file as a script once per rank:
`python test_smddp.py RESULT.json collectives choose` (see `rank_worker`).
"""
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from lm.spec import job
from lm.compat import tf
from lm.distributed import get_strategy
from family_cases import tiny_presets
from smdist_helpers import run_train, train, train_arguments, write_random_dataset
from training.helpers import run_one_after_another

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)


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


def test_the_fake_refuses_what_the_documentation_does_not_list(fake_smdist, monkeypatch):
    import smdistributed.dataparallel.tensorflow as sdp

    with pytest.raises(RuntimeError, match="before init"):
        sdp.size()
    sdp.init()
    with pytest.raises(RuntimeError, match="init\\(\\) called more than once"):
        sdp.init()
    # Horovod has these; the SMDDP page does not.
    assert not hasattr(sdp, "barrier") and not hasattr(sdp, "allgather") and not hasattr(sdp, "grouped_allreduce")
    tape = tf.GradientTape()
    with pytest.raises(sdp.NotSupportedError, match="device_dense"):
        sdp.DistributedGradientTape(tape, device_dense="/gpu:0")
    with pytest.raises(sdp.NotSupportedError, match="device_sparse"):
        sdp.DistributedGradientTape(tape, device_sparse="")
    with pytest.raises(ValueError, match="op=.*ReduceOp.AVERAGE$"):
        sdp.DistributedGradientTape(tape, op=sdp.ReduceOp.SUM)
    with pytest.raises(ValueError, match="compression="):
        sdp.DistributedGradientTape(tape, compression="fp16")
    with pytest.raises(TypeError, match="sparse_as_dense"):
        sdp.DistributedGradientTape(tape, sparse_as_dense="yes")
    with pytest.raises(TypeError, match="tf.GradientTape"):
        sdp.DistributedGradientTape(object())
    value = tf.constant([1.0, 2.0])
    with pytest.raises(TypeError, match="tf.Tensor"):
        sdp.allreduce(tf.IndexedSlices(value, tf.constant([0, 1]), tf.constant([4])), 0, 1)
    with pytest.raises(TypeError, match="tf.Tensor"):
        sdp.allreduce(1.0, 0, 1)
    with pytest.raises(ValueError, match="param_index=1, num_params=1"):
        sdp.allreduce(value, 1, 1)
    with pytest.raises(ValueError, match="op='sum'"):
        sdp.allreduce(value, 0, 1, op="sum")
    with pytest.raises(ValueError, match="op=.*ReduceOp.AVERAGE$"):
        sdp.oob_allreduce(value, op=sdp.ReduceOp.MAX)
    with pytest.raises(ValueError, match="root_rank=1"):
        sdp.broadcast(value, root_rank=1)
    # allreduce is for gradients only (the page: oob_allreduce for any other tensor).
    with pytest.raises(ValueError, match="did not come out of DistributedGradientTape.gradient: allreduce is for "
                                         "gradients only; use oob_allreduce"):
        sdp.allreduce(value, 0, 1)
    with pytest.raises(TypeError, match="tf.Variable"):
        sdp.broadcast_variables([value], root_rank=0)
    # One rank reduces over itself; op None is the documented AVERAGE.
    np.testing.assert_array_equal(sdp.allreduce(sdp.mark_as_gradient(value), 0, 1, op=None).numpy(), [1.0, 2.0])
    sdp.shutdown()
    with pytest.raises(RuntimeError, match="before init"):
        sdp.rank()


def test_more_ranks_than_one_without_a_rendezvous_refuse_to_reduce(fake_smdist, monkeypatch):
    import smdistributed.dataparallel.tensorflow as sdp

    monkeypatch.setenv("FAKE_SDP_SIZE", "2")
    sdp.init()
    with pytest.raises(RuntimeError, match="over 2 ranks needs FAKE_SDP_RENDEZVOUS"):
        sdp.allreduce(sdp.mark_as_gradient(tf.constant(1.0)), 0, 1)


def rank_environment(rank, size, rendezvous):
    environ = {name: value for name, value in os.environ.items() if not name.startswith(("FAKE_", "SM_"))}
    # The repository root too: the rank script resolves its preset with controlplane.presets; and tests/,
    # where this module's family_cases is.
    environ.update(PYTHONPATH=os.pathsep.join([os.path.join(TESTS, "fakes"), os.path.join(os.path.dirname(TESTS),
                                                                                          "training_image"), HERE,
                                               os.path.dirname(TESTS), TESTS]),
                   FAKE_SDP_RANK=str(rank), FAKE_SDP_SIZE=str(size), FAKE_SDP_RENDEZVOUS=rendezvous,
                   TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1",
                   TF_NUM_INTEROP_THREADS="2")
    return environ


def run_ranks(scenarios, size, directory):
    """Run `rank_worker` on `scenarios` in `size` processes; returns each rank's {scenario: results}."""
    rendezvous = os.path.join(directory, "rendezvous")
    os.makedirs(rendezvous)
    processes, outputs = [], []
    for rank in range(size):
        outputs.append(os.path.join(directory, "rank%d.json" % rank))
        processes.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), outputs[-1]] + list(scenarios),
                                          env=rank_environment(rank, size, rendezvous), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, universal_newlines=True))
    logs = [process.communicate(timeout=600)[0] for process in processes]
    for rank, process in enumerate(processes):
        assert process.returncode == 0, "rank %d:\n%s" % (rank, logs[rank])
    results = []
    for path in outputs:
        with open(path) as handle:
            results.append(json.load(handle))
    return results


@pytest.fixture(scope="module")
def rank_scenarios(tmp_path_factory):
    """Each rank's {scenario: results} of every scenario of `rank_worker`, run by one pair of rank processes (one
    TensorFlow start-up per rank for all of them)."""
    return run_ranks(list(SCENARIOS), 2, str(tmp_path_factory.mktemp("ranks")))


def collectives_scenario():
    """Every documented collective once, on values that differ by rank; returns what each gave."""
    import smdistributed.dataparallel.tensorflow as sdp

    sdp.init()
    rank = sdp.rank()
    value = tf.constant([rank + 1.0, 10.0 * (rank + 1)])
    results = {"rank": rank, "value": value.numpy().tolist()}
    for op in sdp.ReduceOp:
        results["allreduce_" + op.name] = sdp.allreduce(sdp.mark_as_gradient(value), 0, 1, op=op).numpy().tolist()

    @tf.function
    def in_a_function(tensor):
        return (sdp.allreduce(sdp.mark_as_gradient(tensor), 0, 2),
                sdp.allreduce(sdp.mark_as_gradient(tensor * 2.0), 1, 2, op=sdp.ReduceOp.SUM))

    results["in_a_function"] = [tensor.numpy().tolist() for tensor in in_a_function(value)]
    results["fp16"] = sdp.allreduce(sdp.mark_as_gradient(tf.constant([1.0 + 2.0 ** -12])), 0, 1,
                                    compression=sdp.Compression.fp16).numpy().tolist()
    results["oob_allreduce"] = sdp.oob_allreduce(value).numpy().tolist()
    results["broadcast"] = sdp.broadcast(value, root_rank=1).numpy().tolist()
    variable = tf.Variable([7.0 * rank, 1.0])
    sdp.broadcast_variables([variable], root_rank=0)
    results["broadcast_variables"] = variable.numpy().tolist()

    table, weight = tf.Variable(tf.reshape(tf.range(8.0), [4, 2])), tf.Variable([2.0, 3.0])
    for sparse_as_dense in (False, True):
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_sum(tf.gather(table, [rank, 3]) * weight) * (rank + 1.0)
        local = tape.gradient(loss, [table, weight])
        reduced = sdp.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense).gradient(loss, [table, weight])
        results["tape_sparse_as_dense_%s" % sparse_as_dense] = {
            "table_type": type(reduced[0]).__name__,
            "table": tf.convert_to_tensor(reduced[0]).numpy().tolist(),
            "table_indices": reduced[0].indices.numpy().tolist() if isinstance(reduced[0], tf.IndexedSlices) else None,
            "local_table": tf.convert_to_tensor(local[0]).numpy().tolist(),
            "local_table_indices": local[0].indices.numpy().tolist(),
            "weight": reduced[1].numpy().tolist(), "local_weight": local[1].numpy().tolist()}
    try:
        sdp.allreduce(sdp.mark_as_gradient(tf.zeros([rank + 1])), 0, 1)
    except RuntimeError as error:
        results["different_shapes"] = str(error)
    sdp.shutdown()
    return results


@pytest.mark.slow
def test_collectives_reduce_the_values_of_two_rank_processes(rank_scenarios):
    ranks = [scenarios["collectives"] for scenarios in rank_scenarios]
    values = np.array([result["value"] for result in ranks])
    for result in ranks:
        np.testing.assert_allclose(result["allreduce_AVERAGE"], values.mean(axis=0))
        np.testing.assert_allclose(result["allreduce_SUM"], values.sum(axis=0))
        np.testing.assert_allclose(result["allreduce_MIN"], values.min(axis=0))
        np.testing.assert_allclose(result["allreduce_MAX"], values.max(axis=0))
        np.testing.assert_allclose(result["in_a_function"][0], values.mean(axis=0))
        np.testing.assert_allclose(result["in_a_function"][1], (2 * values).sum(axis=0))
        # fp16 compression: 1 + 2**-12 is not a float16, so the reduced value is rounded.
        assert result["fp16"] == [float(np.float16(1.0 + 2.0 ** -12))] != [1.0 + 2.0 ** -12]
        np.testing.assert_allclose(result["oob_allreduce"], values.mean(axis=0))
        assert result["broadcast"] == ranks[1]["value"]
        assert result["broadcast_variables"] == [0.0, 1.0]
        assert "ranks disagree" in result["different_shapes"]

    untouched = [result["tape_sparse_as_dense_False"] for result in ranks]
    dense = [result["tape_sparse_as_dense_True"] for result in ranks]
    mean_weight = np.mean([grads["local_weight"] for grads in untouched], axis=0)
    mean_table = np.mean([grads["local_table"] for grads in dense], axis=0)
    for rank in range(2):
        # Without sparse_as_dense the table's IndexedSlices come back as this rank's tape gave them.
        assert untouched[rank]["table_type"] == "IndexedSlices"
        assert untouched[rank]["table_indices"] == untouched[rank]["local_table_indices"] == [rank, 3]
        assert untouched[rank]["table"] == untouched[rank]["local_table"]
        np.testing.assert_allclose(untouched[rank]["weight"], mean_weight)
        # With it, the table's gradient is a tensor, averaged like the rest.
        assert dense[rank]["table_type"] == "EagerTensor"
        np.testing.assert_allclose(dense[rank]["table"], mean_table)
        np.testing.assert_allclose(dense[rank]["weight"], mean_weight)
    assert untouched[0]["table"] != untouched[1]["table"]


@pytest.mark.slow
def test_trains_in_process_through_the_tape_with_sparse_gradients_made_dense(fake_smdist):
    strategy = get_strategy("smddp").setup()
    model, optimizer, losses = train(strategy, steps=3)
    names = fake_smdist.names()
    assert names.count("sdp.init") == 1
    # The tape is wrapped once (at trace); it makes the position table's IndexedSlices dense and
    # reduces every gradient.
    assert [details for name, details in fake_smdist.calls if name == "sdp.DistributedGradientTape"] == [
        {"sparse_as_dense": True}]
    gradient_call = dict(fake_smdist.calls)["sdp.DistributedGradientTape.gradient"]
    assert gradient_call == {"count": len(model.trainable_variables), "reduced": len(model.trainable_variables),
                             "indexed_slices": 0}
    # Model, then optimizer state, broadcast from rank 0 once, after the first step's trace.
    broadcasts = [(index, details) for index, (name, details) in enumerate(fake_smdist.calls)
                  if name == "sdp.broadcast_variables"]
    assert [d["count"] for _, d in broadcasts] == [len(model.variables), len(optimizer.variables)]
    assert all(d["root_rank"] == 0 for _, d in broadcasts)
    assert broadcasts[0][0] > names.index("sdp.DistributedGradientTape.gradient")
    # The loss is not a gradient: it travels by oob_allreduce (the fake refuses allreduce of it).
    assert "sdp.allreduce" not in names and "sdp.oob_allreduce" in names

    single_model, _, single_losses = train(get_strategy("single").setup(), steps=3)
    np.testing.assert_allclose(losses, single_losses, rtol=1e-5)
    for ours, reference in zip(model.get_weights(), single_model.get_weights()):
        np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5)
    assert losses[-1] < losses[0]


def final_checkpoint(out_dir):
    directory = os.path.join(out_dir, "ckpt")
    newest = sorted(name for name in os.listdir(directory) if name.endswith(".npz"))[-1]
    with np.load(os.path.join(directory, newest)) as data:
        return newest, [data[name] for name in sorted(data.files) if name != "__meta__"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_random_dataset(str(tmp_path_factory.mktemp("dataset")))


@pytest.fixture(scope="module")
def single_device_runs(dataset, tmp_path_factory):
    """preset -> (exit status, output, directory) of one device training each family's tiny preset on the global
    batch, one after another in one process (one TensorFlow start-up for all of them)."""
    directories = {preset: str(tmp_path_factory.mktemp("single")) for preset, _ in tiny_presets()}
    ended = run_one_after_another([(train_arguments(dataset, directories[preset], "single", preset=preset,
                                                    model=model), {}) for preset, model in tiny_presets()])
    return {preset: (status, output, directories[preset])
            for (preset, _), (status, output) in zip(tiny_presets(), ended)}


@pytest.mark.slow
@pytest.mark.parametrize("preset, model", tiny_presets())
def test_two_rank_processes_train_like_one_device_on_the_global_batch(tmp_path, dataset, single_device_runs, preset,
                                                                       model):
    rendezvous = str(tmp_path / "rendezvous")
    os.makedirs(rendezvous)
    runs = {}
    for name in ("rank0", "rank1"):
        os.makedirs(str(tmp_path / name))

    def rank_run(rank):
        runs[rank] = run_train(dataset, str(tmp_path / ("rank%d" % rank)), "smddp", {
            "FAKE_SDP_RANK": str(rank), "FAKE_SDP_SIZE": "2", "FAKE_SDP_RENDEZVOUS": rendezvous,
            "LM_REPORT_WEIGHT_DIGEST": "1"}, preset=preset, model=model)

    threads = [threading.Thread(target=rank_run, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for rank in range(2):
        assert runs[rank][0] == 0, "rank %d:\n%s" % (rank, runs[rank][1])
    digests = [line.split()[-1] for rank in range(2) for line in runs[rank][1].splitlines()
               if line.startswith("rank %d/2 weights sha256" % rank)]
    assert len(digests) == 2 and digests[0] == digests[1]  # the replicas stayed in sync
    tapes = [call["details"] for call in runs[0][2] if call["call"] == "sdp.DistributedGradientTape.gradient"]
    assert tapes and all(details["indexed_slices"] == 0 for details in tapes)
    # Only rank 0 logs, checkpoints and exports.
    assert not os.path.exists(str(tmp_path / "rank1" / "ckpt")) and not os.path.exists(str(tmp_path / "rank1" / "model"))
    logged = [[line for line in runs[rank][1].splitlines() if line.startswith(job.TRAIN_LOG_PREFIX)] for rank in range(2)]
    assert len(logged[0]) == 3 and logged[1] == []

    status, output, single_directory = single_device_runs[preset]
    assert status == 0, output
    (ours_name, ours), (single_name, single) = final_checkpoint(str(tmp_path / "rank0")), \
        final_checkpoint(single_directory)
    assert ours_name == single_name == "ckpt-00000003.npz"
    for mine, reference in zip(ours, single):
        np.testing.assert_allclose(mine, reference, rtol=1e-4, atol=1e-5)


def choose_scenario():
    """Ranks whose newest checkpoints differ: what SMDDPStrategy.choose_checkpoint gives each."""
    import smdistributed.dataparallel.tensorflow as sdp

    strategy = get_strategy("smddp").setup()
    results = {"rank": strategy.rank, "chosen": strategy.choose_checkpoint([4, 6][strategy.rank]),
               "without_one_on_rank_0": strategy.choose_checkpoint([None, 6][strategy.rank])}
    sdp.shutdown()
    return results


@pytest.mark.slow
def test_every_rank_resumes_from_the_step_rank_0_chooses(rank_scenarios):
    # Each host has its own checkpoint directory: rank 1's holds a newer step than rank 0's, or
    # rank 0 has none. Every rank must take rank 0's choice (sdp.broadcast from root_rank 0).
    ranks = [scenarios["choose"] for scenarios in rank_scenarios]
    assert [(result["chosen"], result["without_one_on_rank_0"]) for result in ranks] == [(4, None), (4, None)]


SCENARIOS = {"collectives": collectives_scenario, "choose": choose_scenario}


def rank_worker(output, *scenarios):
    """Run `scenarios` one after another, each initializing the library anew and meeting the other ranks in a
    rendezvous directory of its own (a new rendezvous numbers its collectives from 0 again); writes
    {scenario: results}."""
    rendezvous = os.environ["FAKE_SDP_RENDEZVOUS"]
    results = {}
    for scenario in scenarios:
        os.environ["FAKE_SDP_RENDEZVOUS"] = os.path.join(rendezvous, scenario)
        os.makedirs(os.environ["FAKE_SDP_RENDEZVOUS"], exist_ok=True)
        results[scenario] = SCENARIOS[scenario]()
    with open(output, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    rank_worker(*sys.argv[1:])
