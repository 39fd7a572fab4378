"""SMP v1 model replicas (dp_size > 1) averaging gradients with Horovod, against FAKES: the fake
smdistributed.modelparallel (tests/fakes; not AWS's library) and, under its thread ranks, its
fake `horovod.tensorflow` (tests/fakes/smdistributed/modelparallel/fake_horovod.py; not Horovod).

Pages: SageMaker Python SDK, doc/api/training/smd_model_parallel_general.rst ("smd_model_parallel_general"),
"TensorFlow-specific Parameters": horovod (bool) "Must be set to True if hybrid model/data
parallelism is used and the data parallelism (DP) framework is Horovod" (smp.init() initializes
Horovod: the fake's premise, as the runtime's); "Ranking Basics": a dp_group holds "the same model
partition", and allreduce for data parallelism happens within it only. Horovod's API documentation
(horovod.tensorflow docstrings): allreduce (op "Defaults to Average") and
broadcast_variables(variables, root_rank)."""
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from lm.compat import tf
from smdist_helpers import write_random_dataset

HERE = os.path.dirname(os.path.abspath(__file__))
MP = dict(partitions=2, microbatches=2, auto_partition=False, default_partition=0)


@pytest.fixture(scope="module")
def replica_runs(tmp_path_factory):
    """replicas_job.py in a subprocess: {"replicas": 4 ranks, "reference": 2 ranks, "local_mean": 4 ranks}."""
    directory = str(tmp_path_factory.mktemp("replicas"))
    dataset = write_random_dataset(str(tmp_path_factory.mktemp("random_dataset")))
    out = os.path.join(directory, "runs.pickle")
    environ = {name: value for name, value in os.environ.items() if not name.startswith(("SM_", "FAKE_"))}
    environ.update(PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(HERE), "fakes"),
                                               os.path.join(os.path.dirname(os.path.dirname(HERE)), "training_image"),
                                               HERE, os.path.dirname(HERE),  # tests: seeding
                                               os.path.dirname(os.path.dirname(HERE))]),  # root: controlplane
                   TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="2",
                   # The fake's allreduce in a tf.function holds an inter-op thread per rank.
                   TF_NUM_INTEROP_THREADS="4")
    result = subprocess.run([sys.executable, os.path.join(HERE, "replicas_job.py"), dataset, out], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:]
    with open(out, "rb") as handle:
        return pickle.load(handle)


def _by_partition(ranks):
    """{mp_rank: [entry of dp rank 0, entry of dp rank 1, ...]}"""
    found = {}
    for entry in sorted(ranks, key=lambda entry: entry["dp_rank"]):
        found.setdefault(entry["mp_rank"], []).append(entry)
    return found


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[index], b[index]) for index in a)


@pytest.mark.slow
def test_two_replicas_average_gradients_over_the_dp_group_and_train_like_one_replica_on_the_union_batch(
        replica_runs):
    """FAKE SMP + fake Horovod: 4 thread ranks, partitions=2, horovod=true (2 replicas). Each replica
    trains on its own shard; after every step the two replicas hold identical weights for each
    partition (the gradients were averaged with hvd.allreduce over the dp group: smd_model_parallel_general,
    "Ranking Basics"),
    and they equal a 1-replica 2-partition run on the union batch (the same global batch). The
    same job with `_dp_mean` returning the local value leaves the replicas apart: the check can fail."""
    replicas, reference = _by_partition(replica_runs["replicas"]), _by_partition(replica_runs["reference"])
    # Horovod's ranks are the replicas: hvd.rank() == smp.dp_rank(), hvd.size() == smp.dp_size().
    assert sorted((e["rank"], e["mp_rank"], e["dp_rank"], e["hvd"]) for e in replica_runs["replicas"]) == [
        (0, 0, 0, (0, 2)), (1, 1, 0, (0, 2)), (2, 0, 1, (1, 2)), (3, 1, 1, (1, 2))]
    for step in range(3):
        first, second = (replica["steps"][step] for replica in replicas[0])
        # Each replica its shard: disjoint halves, together the reference's global batch.
        assert not {row.tobytes() for row in first["rows"]} & {row.tobytes() for row in second["rows"]}
        np.testing.assert_array_equal(np.concatenate([first["rows"], second["rows"]]),
                                      reference[0][0]["steps"][step]["rows"])
        for mp_rank in (0, 1):
            held = [replica["steps"][step]["weights"] for replica in replicas[mp_rank]]
            expected = reference[mp_rank][0]["steps"][step]["weights"]
            assert held[0] and _same(held[0], held[1]), (step, mp_rank)
            assert held[0].keys() == expected.keys()
            for index in expected:
                np.testing.assert_allclose(held[0][index], expected[index], rtol=1e-4, atol=1e-6)
            # The loss every rank reports is the mean over the global batch.
            assert replicas[mp_rank][0]["steps"][step]["loss"] == replicas[mp_rank][1]["steps"][step]["loss"]
            np.testing.assert_allclose(replicas[mp_rank][0]["steps"][step]["loss"],
                                       reference[mp_rank][0]["steps"][step]["loss"], rtol=1e-5)
    broken = _by_partition(replica_runs["local_mean"])
    for mp_rank in (0, 1):
        apart = [replica["steps"][0]["weights"] for replica in broken[mp_rank]]
        assert not _same(apart[0], apart[1])


def _ranks(monkeypatch, ranks, target, **values):
    import smdistributed.modelparallel.tensorflow as smp
    monkeypatch.setenv("SM_HP_MP_PARAMETERS", json.dumps(values))
    return smp.run_ranks(ranks, target)


def _collectives():
    import smdistributed.modelparallel.tensorflow as smp
    smp.init()
    import horovod.tensorflow as hvd
    mean = hvd.allreduce(tf.constant([float(smp.rank()), 1.0]))
    total = hvd.allreduce(tf.constant([smp.rank()]), op=hvd.Sum)
    weight = tf.Variable([float(smp.rank())] * 3)
    hvd.broadcast_variables([weight], root_rank=1)
    return hvd.rank(), hvd.size(), mean.numpy().tolist(), mean.dtype, total.numpy().tolist(), weight.numpy().tolist()


def test_horovod_of_the_thread_ranks_spans_each_ranks_dp_group(fake_smdist, monkeypatch):
    """FAKE SMP + fake Horovod (smd_model_parallel_general "Ranking Basics": the dp group; Horovod
    API: allreduce averages by default, broadcast_variables assigns the root rank's values): with 4 ranks of 2 partitions, ranks 0 and 2 (partition 0) reduce
    together, and ranks 1 and 3; real values, in the tensor's dtype. The real Horovod is back after."""
    real = sys.modules.get("horovod.tensorflow")
    results = _ranks(monkeypatch, 4, _collectives, partitions=2, microbatches=2, horovod=True)
    # Ranks 0, 2 (dp ranks 0, 1) hold partition 0; ranks 1, 3 partition 1.
    assert [result[:3] for result in results] == [(0, 2, [1.0, 1.0]), (0, 2, [2.0, 1.0]),
                                                  (1, 2, [1.0, 1.0]), (1, 2, [2.0, 1.0])]
    assert all(result[3] == tf.float32 for result in results)
    assert [result[4] for result in results] == [[2], [4], [2], [4]]
    # broadcast_variables(root_rank=1): dp rank 1 of each group is world rank 2 or 3.
    assert [result[5] for result in results] == [[2.0] * 3, [3.0] * 3, [2.0] * 3, [3.0] * 3]
    assert sys.modules.get("horovod.tensorflow") is real
    names = fake_smdist.names()
    assert names.count("hvd.allreduce") == 8 and names.count("hvd.broadcast_variables") == 4


def _refusals():
    import smdistributed.modelparallel.tensorflow as smp
    smp.init()
    import horovod.tensorflow as hvd
    value = tf.constant([1.0, 2.0])
    refused = []

    @tf.function
    def in_graph(x):
        return hvd.allreduce(x)

    attempts = [
        lambda: hvd.init(),
        lambda: hvd.allgather(value),
        lambda: hvd.Adasum,
        lambda: hvd.allreduce(value, prescale_factor=2.0),
        lambda: hvd.broadcast_variables([tf.Variable(value)], root_rank=0, inplace=True),
        lambda: hvd.allreduce(tf.IndexedSlices(value, tf.constant([0, 1]), tf.constant([2]))),
        lambda: hvd.allreduce(tf.constant([1, 2])),
        lambda: hvd.broadcast_variables([tf.Variable(value)], root_rank=3),
        # This process keeps two inter-op threads (tests/smdist/conftest.py), fewer than the 3
        # ranks: an allreduce in a tf.function would hang.
        lambda: in_graph(value),
    ]
    for attempt in attempts:
        try:
            attempt()
        except (RuntimeError, AttributeError, TypeError, ValueError, NotImplementedError) as error:
            refused.append("%s: %s" % (type(error).__name__, error))
        else:
            refused.append(None)
    return refused


def _without_horovod():
    import smdistributed.modelparallel.tensorflow as smp
    smp.init()
    import horovod.tensorflow as hvd
    return hvd.size()


def test_fake_horovod_refuses_hvd_init_and_what_it_does_not_emulate(fake_smdist, monkeypatch):
    """FAKE SMP + fake Horovod. smd_model_parallel_general ("horovod" parameter): with "horovod": true
    smp.init() initializes Horovod, so the script's own hvd.init() raises; calls, ops and arguments the SMP
    runtime does not use (documented by Horovod's API or not) raise, naming the fake."""
    first, second, third = _ranks(monkeypatch, 3, _refusals, partitions=1, microbatches=1, horovod=True)
    assert first == second == third
    expected = [
        ("RuntimeError", "hvd.init() from the script: with mp_parameters.horovod true, smp.init() initializes "
                         "Horovod and a script must never call hvd.init()"),
        ("AttributeError", "horovod.tensorflow.allgather is not emulated"),
        ("AttributeError", "horovod.tensorflow.Adasum is not emulated"),
        ("TypeError", "hvd.allreduce(prescale_factor) is not emulated"),
        ("TypeError", "hvd.broadcast_variables(inplace) is not emulated"),
        ("NotImplementedError", "hvd.allreduce of tf.IndexedSlices (real Horovod allgathers values and indices)"),
        ("TypeError", "hvd.allreduce(op=Average) of a int32 tensor"),
        ("ValueError", "hvd.broadcast_variables(root_rank=3): a Horovod rank below hvd.size()=3"),
        ("RuntimeError", "at least 3 inter-op threads (TF_NUM_INTEROP_THREADS), not 2"),
    ]
    assert len(first) == len(expected)
    for message, (kind, words) in zip(first, expected):
        assert message is not None and message.startswith(kind + ":") and words in message, (message, words)
        assert "fake horovod under SMP" in message
    # With "horovod": false SMP initializes no Horovod: Horovod calls raise.
    with pytest.raises(RuntimeError, match="mp_parameters.horovod is false: SMP did not initialize Horovod"):
        _ranks(monkeypatch, 2, _without_horovod, **MP)
