"""The SMP v1 adapter against the FAKE smdistributed.modelparallel (tests/fakes): not AWS's
library, but one written from its documentation (SageMaker Python SDK, smp_versions/latest
"TensorFlow API" and "Common API"; "Parameters for modelparallel"). Several ranks run as
threads of this process (`smp.run_ranks`), each holding only its partition's variables."""
import itertools
import json
import os

import numpy as np
import pytest

from lm.compat import tf
from controlplane import planner
from lmstack import plan
from controlplane.presets import GPT_PRESETS
from lm.spec.families import parameter_count
from lm.distributed import get_strategy
from smdist_helpers import build_tiny, faked_smdist, sequence_loss, token_batch, train, write_random_dataset


def _mp_parameters(monkeypatch, **values):
    monkeypatch.setenv("SM_HP_MP_PARAMETERS", json.dumps(values))


@pytest.mark.parametrize("raw, message", [
    (None, "SM_HP_MP_PARAMETERS is not set"),
    ("{partitions: 2}", "SM_HP_MP_PARAMETERS is not valid JSON"),
    ("[2]", "mp_parameters must be a JSON object"),
    ('{"microbatches": 4}', "mp_parameters.partitions is required"),
    ('{"partitions": 0}', "mp_parameters.partitions must be a positive integer, got 0"),
    ('{"partitions": 2, "microbatches": "4"}', "mp_parameters.microbatches must be a positive integer, got '4'"),
    ('{"partitions": 2, "microbatches": true}', "mp_parameters.microbatches must be a positive integer, got True"),
    ('{"partitions": 2, "pipeline": "fast"}', "mp_parameters.pipeline must be one of simple, interleaved, got 'fast'"),
    ('{"partitions": 2, "optimize": "size"}', "mp_parameters.optimize must be one of speed, memory, got 'size'"),
    ('{"partitions": 2, "placement_strategy": "x"}', "mp_parameters.placement_strategy must be one of spread, cluster"),
    ('{"partitions": 2, "horovod": "yes"}', "mp_parameters.horovod must be true or false, got 'yes'"),
])
def test_bad_mp_parameters_fail_before_init_naming_the_field(fake_smdist, monkeypatch, raw, message):
    if raw is not None:
        monkeypatch.setenv("SM_HP_MP_PARAMETERS", raw)
    with pytest.raises(ValueError) as error:
        get_strategy("smp").setup()
    assert message in str(error.value)
    assert fake_smdist.names() == []


@pytest.mark.parametrize("placement", [dict(), dict(auto_partition=True), dict(auto_partition=False, default_partition=1)])
def test_several_partitions_need_the_manual_placement_lm_plan_counts(fake_smdist, monkeypatch, placement):
    # smp.partition is ignored under auto-partitioning (the library's utils.py, `partition`).
    _mp_parameters(monkeypatch, partitions=2, microbatches=2, **placement)
    with pytest.raises(ValueError, match="mp_parameters.auto_partition must be false and "
                                         "mp_parameters.default_partition 0 with 2 partitions"):
        get_strategy("smp").setup()
    assert fake_smdist.names() == []


def test_several_replicas_need_horovod(fake_smdist, monkeypatch):
    _mp_parameters(monkeypatch, partitions=2, horovod=False, **MANUAL)
    monkeypatch.setenv("FAKE_SMP_SIZE", "4")
    with pytest.raises(ValueError, match=r"mp_parameters.horovod must be true with 2 model replicas"):
        get_strategy("smp").setup()


def _setup_rank(fake_smdist, monkeypatch, rank, size=4, **values):
    import smdistributed.modelparallel.tensorflow as smp
    smp.reset()
    monkeypatch.setenv("FAKE_SMP_RANK", str(rank))
    monkeypatch.setenv("FAKE_SMP_SIZE", str(size))
    _mp_parameters(monkeypatch, **values)
    return get_strategy("smp").setup()


def test_ranks_and_checkpoint_writers(fake_smdist, monkeypatch):
    layout = []
    for rank in range(4):
        s = _setup_rank(fake_smdist, monkeypatch, rank, partitions=2, horovod=True, **MANUAL)
        layout.append((s.mp_rank, s.data_parallel_rank, s.data_parallel_size, s.writes_checkpoints, s.is_chief))
    # The fake puts one replica's partitions on consecutive ranks; the first replica's ranks save.
    assert layout == [(0, 0, 2, True, True), (1, 0, 2, True, False), (0, 1, 2, False, False), (1, 1, 2, False, False)]
    assert fake_smdist.names().count("smp.init") == 4


@pytest.fixture
def random_dataset(tmp_path):
    return write_random_dataset(str(tmp_path))


def _rows(strategy, directory, steps=3, global_batch=8):
    from lm.data.dataset import TokenStream
    stream = TokenStream(directory, "train", global_batch_size=global_batch, dp_rank=strategy.data_parallel_rank,
                         dp_size=strategy.data_parallel_size, seed=1234)
    return [inputs.numpy() for inputs, _ in itertools.islice(stream.batches(), steps)]


def test_data_is_sharded_by_dp_rank(fake_smdist, monkeypatch, random_dataset):
    seen = [_rows(_setup_rank(fake_smdist, monkeypatch, rank, partitions=2, horovod=True, **MANUAL),
                  random_dataset) for rank in range(4)]
    for step in range(3):
        # The two partitions of a replica (same dp_rank) see the same batch ...
        np.testing.assert_array_equal(seen[0][step], seen[1][step])
        np.testing.assert_array_equal(seen[2][step], seen[3][step])
        # ... the two replicas disjoint halves of the global batch.
        replica_0 = {row.tobytes() for row in seen[0][step]}
        replica_1 = {row.tobytes() for row in seen[2][step]}
        assert len(replica_0) == 4 and len(replica_1) == 4 and not replica_0 & replica_1
    whole = _rows(get_strategy("single").setup(), random_dataset)
    for step in range(3):
        np.testing.assert_array_equal(np.concatenate([seen[0][step], seen[2][step]]), whole[step])


def test_batch_must_divide_into_microbatches(fake_smdist, monkeypatch):
    _mp_parameters(monkeypatch, partitions=1, microbatches=4)
    strategy = get_strategy("smp").setup()
    with pytest.raises(ValueError, match=r"per-replica batch of 6 sequences .* mp_parameters.microbatches=4"):
        train(strategy, steps=1, batch=6)


def _spy(monkeypatch, module, name, log):
    original = getattr(module, name)

    def spy(*args, **kwargs):
        log.append((name, args, kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)


@pytest.mark.slow
def test_microbatched_step_equals_the_full_batch_step(fake_smdist, monkeypatch):
    import horovod.tensorflow as hvd
    import smdistributed.modelparallel.tensorflow as smp

    hvd_calls = []
    for name in ("init", "allreduce", "broadcast_variables"):
        _spy(monkeypatch, hvd, name, hvd_calls)

    _mp_parameters(monkeypatch, partitions=1, microbatches=4, horovod=True)
    strategy = get_strategy("smp").setup()
    model, optimizer, losses = train(strategy, steps=3, batch=8)

    # Forward and backward ran in smp.step on a quarter of the batch per call.
    steps = [details for name, details in fake_smdist.calls
             if name == "smp.step" and details["function"] == "forward_backward"]
    assert steps and all(d["microbatches"] == 4 for d in steps)
    assert steps[0]["shapes"] == {"inputs": [2, 16], "labels": [2, 16]}
    # Horovod: initialized by the library only; gradients (then the loss) all-reduced; state
    # broadcast from rank 0 after the first step: model first, then the optimizer.
    names = [name for name, _, _ in hvd_calls]
    assert names.count("init") == 1 and names.index("init") == 0
    # Counted at trace time: the step's tf.function traces again after its first trace created the
    # microbatch accumulators (StepOutput.accumulate in a tf.function).
    assert names.count("allreduce") in (len(model.trainable_variables) + 1, 2 * (len(model.trainable_variables) + 1))
    broadcasts = [(len(list(args[0])), kwargs) for name, args, kwargs in hvd_calls if name == "broadcast_variables"]
    assert broadcasts == [(len(model.variables), {"root_rank": 0}), (len(optimizer.variables), {"root_rank": 0})]

    # The same run with one microbatch (the whole batch per call) ends with the same weights.
    smp.reset()
    _mp_parameters(monkeypatch, partitions=1, microbatches=1, horovod=True)
    whole_model, _, whole_losses = train(get_strategy("smp").setup(), steps=3, batch=8)
    np.testing.assert_allclose(losses, whole_losses, rtol=1e-5)
    for ours, reference in zip(model.get_weights(), whole_model.get_weights()):
        np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5)

    # And the first step's loss and gradient norm are those of a plain tape on the full batch.
    smp.reset()
    _mp_parameters(monkeypatch, partitions=1, microbatches=4, horovod=True)
    first = get_strategy("smp").setup()
    probe = first.build_model(build_tiny)
    from lm.training.optim import AdamW
    probe_step = first.build_train_step(probe, AdamW(probe.trainable_variables, lambda step: 0.0), sequence_loss)
    # From the probe's initial weights: the library's tracing copy draws its own first, in the same process.
    reference = build_tiny()
    from lm.distributed.smp import weight_paths
    for path, weight in weight_paths(reference).items():
        weight.assign(weight_paths(probe)[path])
    inputs, labels = token_batch(8, seed=0)
    with tf.GradientTape() as tape:
        loss = sequence_loss(labels, reference(inputs, training=True))
    grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, reference.trainable_variables)]
    metrics = probe_step(inputs, labels)
    np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["grad_norm"]), float(tf.linalg.global_norm(grads)), rtol=1e-4)
    assert losses[-1] < losses[0]


@pytest.mark.tf26
def test_a_model_derived_from_gpt_becomes_a_distributed_model_of_its_own_code(fake_smdist, monkeypatch):
    """A family derived from GPT (docs/fork.md: a block variant) gets its own DistributedModel: the adapter
    makes it from the model class the family builds, not from GPT, on the library's Keras."""
    import smdistributed.modelparallel.tensorflow as smp

    from lm.compat import keras
    from lm.models import gpt

    class _ParallelBlock(gpt.BlockCode):
        def residual(self, x, attention, seed):
            return x + attention(self.ln_1(x)) + self.mlp_step(self.ln_2(x), seed)

    class _Variant(gpt.GPTCode):
        block_code = _ParallelBlock

    variant = gpt.gpt_classes(keras, _Variant).GPT
    _mp_parameters(monkeypatch, partitions=1)
    strategy = get_strategy("smp").setup()
    model = strategy.build_model(lambda **options: gpt.build_model(GPT_PRESETS["tiny"], model_class=variant, **options))
    assert isinstance(model, smp.DistributedModel) and type(model).code is _Variant
    assert [type(block).code for block in model.blocks] == [_ParallelBlock, _ParallelBlock]
    inputs, labels = token_batch(4)
    plain = gpt.build_model(GPT_PRESETS["tiny"], model_class=variant)
    plain.set_weights([weight.numpy() for weight in model.weights])
    loss = smp.step(lambda tokens, targets: model(tokens, targets, training=False))(inputs, labels).reduce_mean()
    assert float(loss) == pytest.approx(float(sequence_loss(labels, plain(inputs))), rel=1e-5)
    # and it is not GPT's: the same weights in the sequential block give another loss
    sequential = gpt.build_model(GPT_PRESETS["tiny"])
    sequential.set_weights(plain.get_weights())
    assert float(sequence_loss(labels, sequential(inputs))) != pytest.approx(float(sequence_loss(labels, plain(inputs))))


@pytest.mark.tf26
def test_the_model_is_built_the_way_the_library_builds_a_distributed_model(fake_smdist, monkeypatch):
    import smdistributed.modelparallel.tensorflow as smp

    from lm.compat import keras_of
    from lm.models.gpt import gpt_classes
    _mp_parameters(monkeypatch, partitions=1)
    strategy = get_strategy("smp").setup()
    model = strategy.build_model(build_tiny)
    # One Keras: the GPT of the Keras the library's DistributedModel derives from (TensorFlow's bundled
    # one, v2/model.py line 14), with DistributedModel before that Keras' Model in the MRO, so its
    # __init__ and __call__ run; and every layer of that Keras, so the model tracks them.
    tree = keras_of(smp.DistributedModel)
    assert tree.__name__ == "tensorflow.python.keras" and isinstance(model, gpt_classes(tree).GPT)
    order = type(model).__mro__
    assert order.index(smp.DistributedModel) < order.index(tree.Model)
    names = ["embedding", "block_0", "block_1", "ln_f"]
    assert [layer.name for layer in model.layers] == names
    assert all(isinstance(layer, tree.layers.Layer) for layer in model.layers)
    # The construction path: a tracing copy made from the constructor's arguments, its layers listed
    # (get_layers: the model's own layers on this TensorFlow, whose Keras has no `_layers`), each
    # built with build() in the partition, and the calls through DistributedModel.__call__.
    calls = fake_smdist.calls
    assert [details for name, details in calls if name == "smp.DistributedModel.tracing_copy"] == [
        {"model": "DistributedGPT", "rank": 0, "layers": names}]
    assert [(details["layers"], details["built"]) for name, details in calls
            if name == "smp.DistributedModel.partition"] == [(names, names)]
    assert "smp.DistributedModel.output" in [name for name, _ in calls]
    # One partition holds every weight; Keras' count_params is not available on a rank.
    assert sum(weight.shape.num_elements() for weight in model.weights) == parameter_count(GPT_PRESETS["tiny"])
    with pytest.raises(ValueError, match="count_params"):
        model.count_params()
    with pytest.raises(RuntimeError, match="outside smp.step"):
        model(tf.zeros([1, 4], tf.int32), tf.zeros([1, 4], tf.int32))
    assert os.environ["SM_HP_MP_PARAMETERS"]


class _Scale:
    pass


def _doubling_model(smp):
    class Doubling(smp.DistributedModel):
        def __init__(self):  # the library reads the arguments of the model's own __init__ (v2/model.py)
            super().__init__()

        def call(self, x, scale):
            return x * scale

    return Doubling()


@pytest.mark.tf26
def test_the_precision_policy_reaches_the_librarys_keras(fake_smdist, monkeypatch):
    # lm.training.train sets the policy of both Keras: the model is on TensorFlow's bundled one.
    from lm import compat
    _mp_parameters(monkeypatch, partitions=1)
    strategy = get_strategy("smp").setup()
    compat.set_precision_policy("mixed_bfloat16")
    try:
        model = strategy.build_model(build_tiny)
    finally:
        compat.set_precision_policy("float32")
    attention = model.blocks[0].attention
    assert attention.compute_dtype == "bfloat16" and attention.qkv_kernel.dtype == tf.float32


@pytest.mark.tf26
def test_fake_step_splits_runs_per_microbatch_and_combines(fake_smdist, monkeypatch):
    """The FAKE's smp.step itself: what the adapter tests rely on."""
    import smdistributed.modelparallel.tensorflow as smp
    _mp_parameters(monkeypatch, partitions=1, microbatches=4)
    smp.init()
    model = _doubling_model(smp)
    seen = []

    @smp.step(non_split_inputs=["scale"])
    def double(x, scale):
        seen.append(x.shape[0])
        return model(x, scale), tf.reduce_sum(x)

    x = tf.reshape(tf.range(8, dtype=tf.float32), [8, 1])
    doubled, sums = double(x, tf.constant(2.0))
    assert seen == [2]  # traced once: every microbatch has the same shape
    np.testing.assert_array_equal(doubled.merge().numpy(), 2 * x.numpy())
    assert [float(v) for v in sums.outputs] == [1.0, 5.0, 9.0, 13.0]
    assert float(sums.reduce_mean()) == float(sums.accumulate()) == 7.0
    assert float(sums.reduce_sum()) == 28.0
    with pytest.raises(ValueError, match="not divisible by microbatches=4"):
        double(tf.zeros([6, 1]), tf.constant(1.0))


@pytest.mark.tf26
def test_fake_refuses_what_the_documentation_does_not_allow(fake_smdist, monkeypatch):
    """Each refusal cites the documented rule; a wrong call must fail, the right one pass."""
    import smdistributed.modelparallel.tensorflow as smp
    _mp_parameters(monkeypatch, partitions=1, microbatches=2, pipline="simple")
    with pytest.raises(ValueError, match="pipline are not TensorFlow parameters"):
        smp.init()
    _mp_parameters(monkeypatch, partitions=2, auto_partition=False)
    with pytest.raises(ValueError, match="default_partition is required when auto_partition is false"):
        smp.init()
    _mp_parameters(monkeypatch, partitions=1, microbatches=2)
    smp.init()
    model = _doubling_model(smp)
    with pytest.raises(ValueError, match="interferes with pipelining"):
        smp.step(jit_compile=True)(lambda x: x)
    with pytest.raises(TypeError, match="not tf.function arguments"):
        smp.step(compile=True)(lambda x: x)
    with pytest.raises(ValueError, match="smaller than partitions=1"):
        smp.partition(1)
    with pytest.raises(TypeError, match="must be an smp.CommGroup"):
        smp.allgather(1, "world")
    assert smp.allgather(1, smp.CommGroup.WORLD) == [1]

    @smp.step
    def no_model(x):
        return x * 2

    with pytest.raises(ValueError, match="must return a value that depends on the output of smp.DistributedModel"):
        no_model(tf.zeros([2, 1]))

    @smp.step
    def with_tape(x):
        with tf.GradientTape():
            return model(x, tf.constant(1.0))

    with pytest.raises(RuntimeError, match="tf.GradientTape is not supported inside smp.step"):
        with_tape(tf.zeros([2, 1]))

    @smp.step
    def with_python_object(x, scale):
        return model(x, tf.constant(1.0))

    with pytest.raises(TypeError, match="neither a tensor nor a list"):
        with_python_object(tf.zeros([2, 1]), _Scale())
    manager = smp.CheckpointManager(tf.train.Checkpoint(step=tf.Variable(1)), directory=str(fake_smdist.__file__) + "x")
    with pytest.raises(RuntimeError, match="after the first smp.step"):
        manager.restore()
    # The page lists save() and restore() without arguments, and these four constructor arguments.
    with pytest.raises(TypeError):
        manager.save(checkpoint_number=3)
    with pytest.raises(TypeError):
        manager.restore(restore_prefix="ckpt-1")
    with pytest.raises(TypeError):
        smp.CheckpointManager(tf.train.Checkpoint(), keep_checkpoint_every_n_hours=1)
    with pytest.raises(TypeError, match="takes a tf.train.Checkpoint"):
        smp.CheckpointManager({"step": tf.Variable(1)})
    with pytest.raises(ValueError, match="max_to_keep=0"):
        smp.CheckpointManager(tf.train.Checkpoint(), max_to_keep=0)


# ---- several ranks (threads), each holding only its partition ----

def _job(monkeypatch, ranks, target, **values):
    import smdistributed.modelparallel.tensorflow as smp
    _mp_parameters(monkeypatch, **values)
    return smp.run_ranks(ranks, target)


MANUAL = dict(microbatches=2, auto_partition=False, default_partition=0)


def _partitioned_tiny():
    strategy = get_strategy("smp").setup()
    built = []

    def build_fn(build=True, **options):
        model = build_tiny(build=build, **options)
        built.append(len(model.weights))  # weights that exist before SMP partitions the model
        return model

    model = strategy.build_model(build_fn)
    before = built[0]
    from lm.training.optim import AdamW
    optimizer = AdamW(model.trainable_variables, lambda step: 0.0)
    names = [weight.name for weight in model.weights]
    held = sum(weight.shape.num_elements() for weight in model.weights)
    from lm.distributed.smp import weight_paths
    return strategy.mp_rank, before, names, sorted(weight_paths(model)), len(optimizer.variables), held, \
        [len(block.weights) for block in model.blocks]


@pytest.mark.tf26
def test_each_rank_creates_and_holds_only_its_partitions_variables(fake_smdist, monkeypatch):
    results = _job(monkeypatch, 2, _partitioned_tiny, partitions=2, **MANUAL)
    (rank0, before0, names0, paths0, slots0, held0, blocks0), \
        (rank1, before1, names1, paths1, slots1, held1, blocks1) = results
    # A rank's layers list only its weights: block 1's layers have none on rank 0, block 0's none on rank 1.
    assert blocks0[0] == blocks1[1] > 0 and blocks0[1] == blocks1[0] == 0
    assert (rank0, rank1) == (0, 1) and before0 == before1 == 0  # nothing built before the partition
    # Manual placement: the embeddings, ln_f and block 0 on partition 0; block 1 on partition 1.
    assert any("embedding" in name for name in names0) and all("block_1" not in name for name in names0)
    assert names1 and all("block_1" in name for name in names1)
    # Every weight of the plain model on exactly one rank (by layer path: the export's gather),
    # and Adam keeps state (m, v) for that rank's only.
    from lm.distributed.smp import weight_paths
    assert not set(paths0) & set(paths1)
    assert sorted(paths0 + paths1) == sorted(weight_paths(build_tiny()))
    assert (slots0, slots1) == (1 + 2 * len(paths0), 1 + 2 * len(paths1))
    # controlplane.planner's SMP memory model counts what partition 0, the busiest, holds.
    assert held0 + held1 == parameter_count(GPT_PRESETS["tiny"])
    assert planner.memory(GPT_PRESETS["tiny"], 1, 16, "fp32", partitions=2)["params"] == held0 > held1


def _values_by_path(model):
    from lm.distributed.smp import weight_paths
    return {path: weight.numpy() for path, weight in weight_paths(model).items()}


def _train_and_report(grad_clip=0.05):
    """(mp rank, losses, the values of the weights the rank holds, the whole model's or None), by layer path,
    after 3 train steps and the export's gather."""
    strategy = get_strategy("smp").setup()
    model, optimizer, losses = train(strategy, steps=3, batch=8, grad_clip=grad_clip)
    whole = strategy.whole_model(model)
    return strategy.mp_rank, losses, _values_by_path(model), None if whole is None else _values_by_path(whole)


# The library moves its checkpoint files in pieces of SMP_CKPT_TRANSFER_CHUNK_SIZE (1 GiB unset:
# tensorflow/utils.py), and a partition of gpt-1.3b is about 2.6 GB. Scaled down here through the same
# variable: 60 KiB, less than the tiny model's MLP kernels (64 KiB) and token table (128 KiB), which must
# go in pieces, and than a partition of it.
TRANSFER_CHUNK = 60 * 1024


@pytest.fixture(scope="module")
def two_partitions_trained_and_gathered():
    """([each rank's _train_and_report], [bytes of each smp.send]) of 2 partitions, the export's gather in
    pieces of TRANSFER_CHUNK: one job for the clip test and the export test."""
    with pytest.MonkeyPatch.context() as monkeypatch, faked_smdist(monkeypatch) as smdistributed:
        monkeypatch.setenv("SMP_CKPT_TRANSFER_CHUNK_SIZE", str(TRANSFER_CHUNK))
        ranks = _job(monkeypatch, 2, _train_and_report, partitions=2, **MANUAL)
        return ranks, [details["bytes"] for name, details in smdistributed.calls if name == "smp.send"]


@pytest.mark.tf26
@pytest.mark.slow
def test_two_partitions_clip_and_train_like_one(fake_smdist, monkeypatch, two_partitions_trained_and_gathered):
    # grad_clip 0.05 is far below the tiny model's gradient norm (about 1), so every step clips:
    # both partitions must scale by the factor of the WHOLE model's norm.
    (_, reference_losses, _, reference), = _job(monkeypatch, 1, _train_and_report, partitions=1, microbatches=2)
    first, second = two_partitions_trained_and_gathered[0]
    assert first[1] == second[1]  # both ranks report the same (replica-wide) loss
    np.testing.assert_allclose(first[1], reference_losses, rtol=1e-5)
    assert second[3] is None  # the whole model is gathered on the chief only
    assert sorted(first[3]) == sorted(reference)
    for path, theirs in reference.items():
        np.testing.assert_allclose(first[3][path], theirs, rtol=1e-4, atol=1e-6)


@pytest.mark.tf26
def test_the_export_gathers_each_partition_in_pieces_of_the_librarys_transfer_chunk(
        two_partitions_trained_and_gathered):
    (_, _, held0, whole), (_, _, held1, nothing) = two_partitions_trained_and_gathered[0]
    assert nothing is None and sorted(whole) == sorted(list(held0) + list(held1))
    for path, value in list(held0.items()) + list(held1.items()):
        np.testing.assert_array_equal(whole[path], value)
    # Rank 1 sent each of its weights to the chief, block_1's MLP kernels (64 KiB each) in two pieces.
    sent = two_partitions_trained_and_gathered[1]
    assert len(sent) == len(held1) + 2


def _gather(payload):
    import smdistributed.modelparallel.tensorflow as smp
    smp.init()
    return smp.allgather(payload, smp.CommGroup.MP_GROUP)


@pytest.mark.tf26
@pytest.mark.parametrize("variable, fits, message", [
    ("FAKE_SMP_MESSAGE_BYTES", 900, "at most 1000 bytes"),  # the pickle's size, a C int (scaled down)
    ("SMP_CKPT_TRANSFER_CHUNK_SIZE", 1000, "pieces of at most SMP_CKPT_TRANSFER_CHUNK_SIZE = 1000 bytes"),
])
def test_the_fake_refuses_a_message_over_the_librarys_limits(fake_smdist, monkeypatch, variable, fits, message):
    monkeypatch.setenv(variable, "1000")
    assert len(_job(monkeypatch, 2, lambda: _gather(b"x" * fits), partitions=2, **MANUAL)[0]) == 2
    with pytest.raises(OverflowError, match=message):
        _job(monkeypatch, 2, lambda: _gather(b"x" * (fits + 100)), partitions=2, **MANUAL)


def _norm_of_partitions(squares):
    strategy = get_strategy("smp").setup()
    return float(strategy.model_parallel_norm(squares[strategy.mp_rank]))


@pytest.mark.parametrize("squares, expected", [((9.0, 16.0), 5.0), ((4.0, float("inf")), float("inf")),
                                               ((float("nan"), 1.0), float("nan"))])
def test_gradient_norm_and_overflow_are_decided_over_the_model_parallel_group(fake_smdist, monkeypatch, squares,
                                                                             expected):
    # An inf/nan on one partition gives every partition a non-finite norm: all skip the step.
    norms = _job(monkeypatch, 2, lambda: _norm_of_partitions(squares), partitions=2, **MANUAL)
    np.testing.assert_equal(norms, [expected, expected])


def _vote(stopping_rank):
    from lm.training.train import agree
    strategy = get_strategy("smp").setup()
    return agree(strategy, strategy.rank == stopping_rank)


@pytest.mark.parametrize("stopping_rank", [None, 0, 1])
def test_the_stop_vote_spans_every_rank(fake_smdist, monkeypatch, stopping_rank):
    # With one replica the data-parallel group of each rank is that rank alone: a vote over it
    # would let rank 0 stop while its pipeline partner trains on (and hangs).
    votes = _job(monkeypatch, 2, lambda: _vote(stopping_rank), partitions=2, **MANUAL)
    assert votes == [stopping_rank is not None] * 2


def _choose(newest):
    strategy = get_strategy("smp").setup()
    return strategy.choose_checkpoint(newest[strategy.rank])


def test_every_rank_resumes_from_rank_0s_choice(fake_smdist, monkeypatch):
    # Rank 1's partition has a newer file than rank 0's (its write finished, rank 0's did not).
    assert _job(monkeypatch, 2, lambda: _choose([4, 6]), partitions=2, **MANUAL) == [4, 4]
    assert _job(monkeypatch, 2, lambda: _choose([None, 6]), partitions=2, **MANUAL) == [None, None]


def _checkpoint_cases(directory):
    """On one model of 2 partitions (built once): _save_the_whole_model, then _save_twice_then_restore with
    rank 0's choice and with each rank's own newest; {case: result}."""
    from lm.training.optim import AdamW
    strategy = get_strategy("smp").setup()
    model = strategy.build_model(build_tiny)
    cases = {"whole model": _save_the_whole_model(strategy, model, os.path.join(directory, "whole"))}
    optimizer = AdamW(model.trainable_variables, lambda step: 0.0)
    for own in (False, True):  # each its own newest last: then the ranks restore different steps
        cases[own] = _save_twice_then_restore(strategy, model, optimizer, os.path.join(directory, str(own)), own)
    return cases


@pytest.fixture(scope="module")
def checkpoint_cases(tmp_path_factory):
    """Each rank's _checkpoint_cases: one job for the tests of what the ranks save and restore."""
    directory = str(tmp_path_factory.mktemp("checkpoints"))
    with pytest.MonkeyPatch.context() as monkeypatch, faked_smdist(monkeypatch):
        return _job(monkeypatch, 2, lambda: _checkpoint_cases(directory), partitions=2, **MANUAL)


def _save_twice_then_restore(strategy, model, optimizer, directory, each_rank_its_own_newest):
    """Save steps 2 and 4 into one directory, then restore from host-local copies of it in which
    rank 0's host lacks the mark of step 4; returns (chosen step, restored optimizer step, a weight)."""
    import shutil

    state = list(model.weights) + optimizer.variables

    def fill(value):
        optimizer.step.assign(int(value))
        for weight in model.weights:
            weight.assign(tf.fill(weight.shape, tf.cast(value, weight.dtype)))

    saved = strategy.checkpoints(os.path.join(directory, "job"))
    for step in (2, 4):
        fill(step)
        saved.save(step, state, {"step_values": step})
    host = os.path.join(directory, "host%d" % strategy.rank)
    if strategy.is_chief:
        for rank in range(strategy.size):
            shutil.copytree(os.path.join(directory, "job"), os.path.join(directory, "host%d" % rank))
        os.remove(os.path.join(host, "smp-00000004", "complete.json"))
    strategy.barrier()
    checkpoints = strategy.checkpoints(host)
    newest = checkpoints.newest_step()
    chosen = newest if each_rank_its_own_newest else strategy.choose_checkpoint(newest)
    fill(0)
    checkpoints.restore(chosen, state)
    return chosen, int(optimizer.step.numpy()), float(np.asarray(model.weights[0].numpy()).flat[0])


@pytest.mark.tf26
@pytest.mark.parametrize("each_rank_its_own_newest", [False, True], ids=["rank 0 chooses", "old: each its own"])
def test_ranks_whose_newest_checkpoints_differ_all_restore_rank_0s_choice(checkpoint_cases, each_rank_its_own_newest):
    results = [cases[each_rank_its_own_newest] for cases in checkpoint_cases]
    every_rank_restored_step_2 = results == [(2, 2, 2.0), (2, 2, 2.0)]
    # The old way (each rank resumes from its own directory's newest) fails this check: rank 1
    # would restore step 4 while rank 0 restores step 2.
    assert every_rank_restored_step_2 != each_rank_its_own_newest, results


def _save_the_whole_model(strategy, model, directory):
    import smdistributed
    # The page's own example: tf.train.Checkpoint(model=model), whose object graph reaches every
    # partition's layers; each rank saves the variables it holds only.
    strategy._smp.CheckpointManager(tf.train.Checkpoint(model=model), directory=directory).save()
    saved = [details["variables"] for name, details in smdistributed.calls
             if name == "smp.CheckpointManager.save" and details["rank"] == strategy.rank]
    return saved, len(model.weights)


@pytest.mark.tf26
def test_each_rank_saves_only_the_variables_it_holds(checkpoint_cases):
    (saved0, held0), (saved1, held1) = [cases["whole model"] for cases in checkpoint_cases]
    assert (saved0, saved1) == ([held0], [held1]) and held0 and held1


@pytest.fixture(scope="module")
def trained_in_four_microbatches():
    """{call: [details]} of what the fake recorded in 2 train steps of 2 partitions in 4 microbatches (smp.step,
    StepOutput.accumulate, DistributedModel.output): one job for the tests that read it."""
    with pytest.MonkeyPatch.context() as monkeypatch, faked_smdist(monkeypatch) as smdistributed:
        _job(monkeypatch, 2, lambda: train(get_strategy("smp").setup(), steps=2, batch=8), partitions=2,
             microbatches=4, auto_partition=False, default_partition=0)
        return {name: [details for call, details in smdistributed.calls if call == name]
                for name in ("smp.step", "smp.StepOutput.accumulate", "smp.DistributedModel.output")}


def test_the_model_returns_the_scalar_loss_not_the_logits(trained_in_four_microbatches):
    # Tensors returned by DistributedModel.call are broadcast to every partition: the logits
    # (vocab floats per token) must not be among them.
    outputs = trained_in_four_microbatches["smp.DistributedModel.output"]
    assert outputs and all(details["shapes"] == [[]] and details["bytes"] == 4 for details in outputs)


def _step_with_overflow_on(overflowing_mp_rank):
    import smdistributed.modelparallel.tensorflow as smp

    from lm.training.optim import AdamW, DynamicLossScale

    class Overflowing(DynamicLossScale):
        """A float16 overflow in one partition's gradients only."""

        def unscale(self, grads):
            grads = super().unscale(grads)
            return [grad * np.inf for grad in grads] if smp.mp_rank() == overflowing_mp_rank else grads

    strategy = get_strategy("smp").setup()
    model = strategy.build_model(build_tiny)
    optimizer = AdamW(model.trainable_variables, lambda step: 1e-2)
    loss_scale = Overflowing(initial=2.0 ** 10)
    step = strategy.build_train_step(model, optimizer, sequence_loss, grad_clip=1.0, loss_scale=loss_scale)
    metrics = step(*token_batch(8))
    return int(optimizer.step.numpy()), float(loss_scale.value.numpy()), float(metrics["grad_norm"])


@pytest.fixture(scope="module")
def step_without_overflow():
    """(applied steps, loss scale, norm) of the step of one partition that does not overflow (the same in
    every parametrization of the test below: run once)."""
    with pytest.MonkeyPatch.context() as monkeypatch, faked_smdist(monkeypatch):
        (no_overflow,) = _job(monkeypatch, 1, lambda: _step_with_overflow_on(None), partitions=1, microbatches=2)
        return no_overflow


@pytest.mark.parametrize("overflowing_mp_rank", [0, 1])
def test_an_overflow_in_one_partition_skips_the_step_on_every_partition(fake_smdist, monkeypatch,
                                                                      step_without_overflow, overflowing_mp_rank):
    results = _job(monkeypatch, 2, lambda: _step_with_overflow_on(overflowing_mp_rank), partitions=2, **MANUAL)
    # Neither partition applies the update; both halve the loss scale; both saw the same norm.
    assert [(applied, scale) for applied, scale, _ in results] == [(0, 2.0 ** 9)] * 2
    assert all(np.isnan(norm) or np.isinf(norm) for _, _, norm in results)
    assert step_without_overflow[:2] == (1, 2.0 ** 10)


def test_lm_plan_says_what_the_busiest_smp_gpu_holds():
    table = plan.format_table(planner.plan("gpt-1.3b", "ml.p3.16xlarge", 10, "smp", recompute=True, partitions=4))
    assert "(smp: the GPU of partition 0 of 4, the busiest: the embeddings, the output layer, the loss and 6 of " \
           "the 24 blocks" in table
    assert "smp:" not in plan.format_table(planner.plan("gpt-125m", "ml.g5.xlarge", 1, "single"))


# ---- what the library's own code does (GitHub tkazusa/smdistributed_modelparallel, 1.12.1) ----

def _model_around_a_layer_built_outside(smp):
    """A DistributedModel around a layer built outside it (as lm.distributed.smp once wrapped a GPT)."""
    from lm.compat import keras_of
    from lm.models.gpt import gpt_classes

    class Wrapper(smp.DistributedModel):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def call(self, inputs, labels, training=None):
            return sequence_loss(labels, self.inner.project(self.inner(inputs)))

    return Wrapper(gpt_classes(keras_of(smp.DistributedModel)).Embedding(512, 16, 8, name="embedding"))


@pytest.mark.tf26
def test_a_model_around_layers_built_outside_it_is_refused(fake_smdist, monkeypatch):
    # The library re-creates the model from its constructor's arguments for tracing and refuses
    # layers with their own build() that both copies share (v2/model.py, lines 62-126, 249-257).
    import smdistributed.modelparallel.tensorflow as smp
    _mp_parameters(monkeypatch, partitions=1, microbatches=2)
    strategy = get_strategy("smp").setup()
    wrapped = _model_around_a_layer_built_outside(smp)

    @smp.step
    def loss_of(inputs, labels):
        return wrapped(inputs, labels)

    with pytest.raises(ValueError, match=r"Layers that have a build\(\) method implemented must be created in the "
                                         r"__init__ .*'embedding'"):
        loss_of(*token_batch(2))
    # Our model creates its layers from plain arguments: the copy has layers of its own.
    built = strategy.build_model(build_tiny)
    copy = built._fake_copy.value
    assert type(copy) is type(built) and copy.model_config == built.model_config
    assert not {id(layer) for layer in copy.layers} & {id(layer) for layer in built.layers}


@pytest.mark.tf26
def test_the_tracing_copy_lacks_the_dropout_key_so_dropout_is_refused_with_smp(fake_smdist, monkeypatch):
    # lm.training.train attaches the run's dropout key to the model it built; the library traces the copy it
    # made from the constructor's arguments before that (v2/model.py, lines 62-64 and 263), which draws its
    # masks from TensorFlow's global generator: not reproducible on resume. Every path refuses the pair.
    from controlplane.presets import train_arguments
    from lm.checkpoint import DropoutKey
    from lm.training.train import parse_args
    _mp_parameters(monkeypatch, partitions=1, microbatches=2)
    key = DropoutKey(seed=1, data_parallel_rank=0)
    built = get_strategy("smp").setup().build_model(lambda **options: key.attach(build_tiny(**options)))
    assert built.dropout_key is key and built._fake_copy.value.dropout_key is None
    with pytest.raises(ValueError, match="hyperparameters.dropout must be 0 with strategy smp, got 0.1"):
        parse_args(["--strategy", "smp", "--dropout", "0.1", "--data-dir", "x"])
    tiny = train_arguments("tiny") + ["--data-dir", "x"]
    assert parse_args(["--strategy", "smp", "--dropout", "0"] + tiny)[0].dropout == 0
    assert parse_args(["--strategy", "horovod", "--dropout", "0.1"] + tiny)[0].dropout == 0.1


def _librarys_keras(monkeypatch):
    import smdistributed.modelparallel.tensorflow as smp

    from lm.compat import keras_of
    _mp_parameters(monkeypatch, partitions=1)
    smp.init()
    return smp, keras_of(smp.DistributedModel)


@pytest.mark.tf26
def test_the_tracing_copy_takes_the_arguments_of_the_frame_that_called_distributed_models_init(fake_smdist,
                                                                                               monkeypatch):
    # Read three frames out of _get_init_args: the caller of DistributedModel.__init__, whatever class
    # that __init__ belongs to (v2/model.py, lines 97-126).
    smp, keras = _librarys_keras(monkeypatch)

    class Dense(smp.DistributedModel):
        def __init__(self, width, **kwargs):
            super().__init__(**kwargs)
            self.width = width
            self.dense = keras.layers.Dense(width)

        def call(self, x):
            return self.dense(x)

    class Inherited(Dense):
        pass

    class Renamed(Dense):
        def __init__(self, size, **kwargs):
            super().__init__(size, **kwargs)

    copy = Inherited(3, name="inherited")._fake_copy.value
    assert type(copy) is Inherited and copy.width == 3 and copy.name == "inherited"
    # Renamed.__init__ reaches DistributedModel.__init__ through Dense.__init__, whose frame has no `size`.
    with pytest.raises(KeyError, match=r"Renamed.__init__'s parameters \['size'\] are not variables of __init__"):
        Renamed(3)


@pytest.mark.tf26
@pytest.mark.parametrize("builds_inner", [False, True])
def test_a_sublayer_that_only_its_parents_call_builds_is_refused(fake_smdist, monkeypatch, builds_inner):
    # The library's ranks build the layers get_layers lists with build() and never call them
    # (v2/serialization.py, lines 280-313); on this TensorFlow those are the model's own layers.
    smp, keras = _librarys_keras(monkeypatch)

    class Outer(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dense(2, name="inner")

        def build(self, input_shape):
            if builds_inner:
                with tf.name_scope(self.inner.name):
                    self.inner.build(input_shape)
            super().build(input_shape)

        def call(self, x):
            return self.inner(x)

    class Model(smp.DistributedModel):
        def __init__(self):
            super().__init__()
            self.outer = Outer(name="outer")

        def call(self, x):
            return self.outer(x)

    model = Model()

    @smp.step
    def forward(x):
        return model(x)

    if builds_inner:
        assert forward(tf.ones([2, 3])).outputs[0].shape == [2, 2]
    else:
        with pytest.raises(RuntimeError, match="'kernel' is created in a layer's call"):
            forward(tf.ones([2, 3]))


def test_microbatch_gradients_accumulate_in_a_tf_function_one_microbatch_at_a_time(trained_in_four_microbatches):
    # Called eagerly, smp.step returns every microbatch's gradients at once and accumulate()
    # averages them (split.py, lines 216-218): M x the partition's gradient bytes alive. In a
    # tf.function it adds them one by one into an accumulator (lines 236-265).
    steps = [details for details in trained_in_four_microbatches["smp.step"]
             if details["function"] == "forward_backward" and details["rank"] == 0]
    accumulated = trained_in_four_microbatches["smp.StepOutput.accumulate"]
    assert steps and not any(details["eager"] for details in steps)
    assert accumulated and all(details["method"] == "variable" and not details["eager"] and details["alive"] == 1
                               and details["microbatches"] == 4 for details in accumulated)
