"""Every configuration controlplane.planner approves is one the runtime accepts (issue 16 item 8).

Runs the plan over a grid of presets x instance types x counts x strategies x global batches,
then the runtime's own checks on each approved configuration: lm.data.dataset.TokenStream's split of the
global batch over the data-parallel ranks (on a real dataset), lm.spec.job.validate_mp_parameters on
the plan's SMP parameters, and the shares the strategies cut from a worker's batch.
"""
import itertools
import json

import pytest

from controlplane import planner
from controlplane import presets
from lm.spec import hardware
from lm.spec import job
from lm.training import train
from lm.data.dataset import TokenStream

PRESETS = ["gpt-125m", "gpt-1.3b"]
INSTANCE_TYPES = ["ml.p3.16xlarge", "ml.p4d.24xlarge", "ml.g5.12xlarge", "ml.g5.xlarge"]
COUNTS = [1, 2, 3, 10]
BATCHES = [8, 48, 100, 512]


def _runtime_data_parallel(strategy, verdict_plan, instance_count):
    """The data-parallel size lm.training.train hands TokenStream for this strategy."""
    if strategy == "mwms":
        return instance_count  # one TokenStream rank per worker; the worker splits over its GPUs
    return verdict_plan["data_parallel"]


def _recompute(strategy):
    """Recomputation wherever a strategy takes it (controlplane.rules refuses it with smp)."""
    return strategy != "smp"


def _approved():
    for preset, instance_type, count, strategy, batch in itertools.product(
            PRESETS, INSTANCE_TYPES, COUNTS, job.STRATEGIES, BATCHES):
        verdict = planner.check(preset, instance_type, count, strategy, global_batch=batch,
                             recompute=_recompute(strategy))
        if verdict.ok:
            yield preset, instance_type, count, strategy, batch, verdict.plan["chosen"]


def test_the_grid_approves_configurations_of_every_strategy():
    assert {approved[3] for approved in _approved()} == set(job.STRATEGIES)


def test_every_approved_configuration_passes_the_runtime_checks(text_dataset):
    disagreements = []
    for preset, instance_type, count, strategy, batch, chosen in _approved():
        batch = chosen["global_batch"]  # the plan picks the nearest valid batch (and says so)
        where = "%s %d x %s %s global_batch=%d" % (preset, count, instance_type, strategy, batch)
        dp_size = _runtime_data_parallel(strategy, chosen, count)
        try:
            stream = TokenStream(text_dataset, "train", global_batch_size=batch, dp_rank=0, dp_size=dp_size)
        except ValueError as error:
            disagreements.append("%s: %s" % (where, error))
            continue
        if strategy == "mwms":
            gpus = hardware.INSTANCES[instance_type].gpus
            if stream.batch_size % gpus:
                disagreements.append("%s: a worker's %d sequences do not split over %d GPUs"
                                     % (where, stream.batch_size, gpus))
        if strategy == "smp":
            parameters = job.validate_mp_parameters(dict(chosen["mp_parameters"]))
            if stream.batch_size % parameters["microbatches"]:
                disagreements.append("%s: %d sequences per replica, %d microbatches"
                                     % (where, stream.batch_size, parameters["microbatches"]))
            if chosen["data_parallel"] > 1 and parameters.get("horovod") is not True:
                disagreements.append("%s: %d model replicas need mp_parameters.horovod=true"
                                     % (where, chosen["data_parallel"]))
    assert not disagreements, "\n".join(disagreements)


def test_the_grid_holds_batches_the_plan_moved_to_the_nearest_valid_one():
    moved = [(batch, chosen["global_batch"], chosen["data_parallel"]) for *_, batch, chosen in _approved()
             if batch != chosen["global_batch"]]
    assert moved
    for requested, picked, data_parallel in moved:
        assert picked % data_parallel == 0 and abs(picked - requested) <= data_parallel, (requested, picked)


# ---- python -m lm.training.train --dry-run: the runtime's checks, without training ----

def _dry_run_arguments(preset, instance_type, count, strategy, chosen, recompute=True):
    """The plan's hyperparameters and layout as lm.training.train's command line (as the toolkit passes them)."""
    argv = ["--dry-run", *presets.train_arguments(preset), "--strategy", strategy, "--global_batch_size", str(chosen["global_batch"]),
            "--recompute", str(recompute).lower(), "--instance-type", instance_type, "--instance-count", str(count)]
    if strategy == "smp":
        argv += ["--mp_parameters", json.dumps(chosen["mp_parameters"])]
    return argv


def test_the_dry_run_accepts_every_configuration_the_plan_approves(capsys):
    refused = []
    for preset, instance_type, count, strategy, _, chosen in _approved():
        argv = _dry_run_arguments(preset, instance_type, count, strategy, chosen, _recompute(strategy))
        if train.main(argv) != 0:
            refused.append("%s: %s" % (" ".join(argv), capsys.readouterr().err.strip()))
    assert not refused, "\n".join(refused)


@pytest.mark.parametrize("change, message", [
    ({"--global_batch_size": "100"}, "global_batch_size (100) must be divisible by the data-parallel size (8)"),
    ({"--mp_parameters": '{"partitions": 2, "microbatches": 2}'}, "mp_parameters.horovod must be true with 8 model"),
    ({"--mp_parameters": '{"partitions": 3, "horovod": true}'}, "mp_parameters.partitions=3 does not divide"),
    ({"--mp_parameters": '{"partitions": 2, "microbatches": 3, "horovod": true}'},
     "is not divisible by mp_parameters.microbatches=3"),
    ({"--strategy": "mwms", "--global_batch_size": "20"}, "a worker's 10 sequences (global_batch_size / 2 workers) "
                                                          "do not split evenly over its 8 GPUs"),
    ({"--strategy": "single"}, "strategy single runs on one instance, got instance_count=2"),
    ({"--instance-type": "ml.p9.large"}, "ml.p9.large"),
    ({"--learning_rate": "7"}, "learning_rate must be between"),
    ({"--recompute": "true"}, "hyperparameters.recompute must be false with strategy smp"),
    ({"--mp_parameters": '{"partitions": 2, "microbatches": 4, "horovod": true}'},
     "mp_parameters.auto_partition must be false and mp_parameters.default_partition 0 with 2 partitions"),
])
def test_the_dry_run_refuses_what_the_runtime_refuses(change, message, capsys):
    arguments = {"--dry-run": None, "--preset": "gpt-125m", "--model_config": presets.model_config("gpt-125m"),
                 "--strategy": "smp", "--global_batch_size": "64",
                 "--mp_parameters": '{"partitions": 2, "microbatches": 4, "horovod": true, "auto_partition": false, '
                                    '"default_partition": 0}',
                 "--instance-type": "ml.p3.16xlarge", "--instance-count": "2"}
    arguments.update(change)
    argv = [item for key, value in arguments.items() for item in ([key] if value is None else [key, value])]
    assert train.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("environment, seen", [
    ("ml.p3.16xlarge", "ml.p3.16xlarge"),
    # The toolkit's value when the resource config names no instance (sagemaker_training.environment):
    # local mode and the demo's local hosts, which no instance-type rule can judge.
    ("local", None), ("local_gpu", None), (None, None),
])
def test_the_runtime_reads_the_instance_type_sagemaker_names(monkeypatch, environment, seen):
    if environment is None:
        monkeypatch.delenv("SM_CURRENT_INSTANCE_TYPE", raising=False)
    else:
        monkeypatch.setenv("SM_CURRENT_INSTANCE_TYPE", environment)
    hp, paths = train.parse_args(["--dry-run", *presets.train_arguments("tiny")])
    assert paths.instance_type == seen


def test_the_dry_run_opens_the_dataset_as_training_does(text_dataset, tmp_path, capsys):
    base = ["--dry-run", *presets.train_arguments("tiny"), "--strategy", "horovod", "--instance-type", "ml.p3.16xlarge",
            "--instance-count", "1", "--data-dir", text_dataset, "--checkpoint-dir", str(tmp_path)]
    assert train.main(base + ["--global_batch_size", "16"]) == 0
    assert "dataset %s" % text_dataset in capsys.readouterr().out
    assert train.main(base + ["--global_batch_size", "16", "--seq_len", "32"]) == 2
    assert "hyperparameters.seq_len is 32 but the dataset's records hold 64 tokens" in capsys.readouterr().err
    assert train.main(base + ["--global_batch_size", "65536"]) == 2
    assert "fewer than one global batch of 65536" in capsys.readouterr().err


def test_lmstack_start_refuses_a_batch_the_runtime_would_refuse():
    from lmstack import start
    from stacks.settings import Settings

    run = {"preset": "gpt-125m", "strategy": "horovod", "instance_type": "ml.p3.16xlarge", "instance_count": 2}
    # 6 sequences of 2,048 tokens a 16 GB V100 holds only with recomputation (the gate plans the batch as asked)
    with pytest.raises(start.StartError) as error:
        start.validate_input(dict(run, hyperparameters={"global_batch_size": 100, "recompute": True}), Settings())
    assert "set hyperparameters.global_batch_size to 96" in str(error.value)
    start.validate_input(dict(run, hyperparameters={"global_batch_size": 96, "recompute": True}), Settings())


def test_lmstack_start_refuses_recomputation_with_smp_from_the_rule_table():
    from lmstack import start
    from stacks.settings import Settings

    run = {"preset": "gpt-125m", "strategy": "smp", "instance_type": "ml.p3.16xlarge", "instance_count": 1,
           "mp_parameters": {"partitions": 2, "microbatches": 4}, "hyperparameters": {"global_batch_size": 16}}
    start.validate_input(run, Settings())
    with pytest.raises(start.StartError, match="hyperparameters.recompute must be false with strategy smp"):
        start.validate_input(dict(run, hyperparameters={"global_batch_size": 16, "recompute": True}), Settings())


# ---- what the plan counts against what the strategies run ----

def test_the_strategies_whose_checkpoints_are_background_snapshots(tmp_path):
    """controlplane.planner charges CHECKPOINT_SNAPSHOT_BYTES a parameter exactly to the strategies whose
    checkpoints are lm.checkpoint's background snapshots."""
    from lm import checkpoint
    from lm import distributed

    for name in job.STRATEGIES:
        kept = distributed.get_strategy(name).checkpoints(str(tmp_path))
        files = getattr(kept, "files", None)
        background = isinstance(files, checkpoint.Checkpointer) and files._writer is not None
        assert background == (name in planner.SNAPSHOT_STRATEGIES), name


def _train_step_graph(strategy, xla):
    """The traced train step of `strategy` (set up) on the tiny preset, as a tf.Graph."""
    from lm.training import optim
    from lm import models
    from lm.compat import tf
    from controlplane.presets import get_preset

    with strategy.scope():
        model = models.build(get_preset("tiny"))
        optimizer = optim.AdamW(model.trainable_variables, lambda step: 1e-3)
    step = strategy.build_train_step(model, optimizer, train.token_loss(tf), grad_clip=1.0, jit_compile=xla)
    spec = tf.TensorSpec([8, 16], tf.int32)
    return step.get_concrete_function(spec, spec).graph, len(model.trainable_variables)


@pytest.mark.parametrize("xla", [True, False])
def test_horovods_all_reduce_waits_for_every_gradient_as_the_plan_counts(xla):
    from lm.distributed import get_strategy

    strategy = get_strategy("horovod").setup()
    try:
        graph, gradients = _train_step_graph(strategy, xla)
    finally:
        strategy.shutdown()
    grouped = [op for op in graph.get_operations() if op.type == "HorovodGroupedAllreduce"]
    # One op whose inputs are every gradient: it runs when the backward pass has made the last one.
    assert [len(op.inputs) for op in grouped] == [gradients]
    assert not planner.allreduce_overlaps_backward("horovod", xla)


def test_mwms_packs_every_gradient_into_one_all_reduce_as_the_plan_counts():
    from tensorflow.python.distribute import cross_device_utils

    from lm.distributed import get_strategy

    strategy = get_strategy("mwms").setup()
    # The strategy is made without communication options: bytes_per_pack 0, which TensorFlow's
    # packing turns into one pack, concatenated and all-reduced once every gradient exists.
    options = strategy.strategy.extended._communication_options
    assert options.bytes_per_pack == 0
    assert cross_device_utils.group_by_size(["g1", "g2", "g3"], options.bytes_per_pack) == [["g1", "g2", "g3"]]
    assert not planner.allreduce_overlaps_backward("mwms", True)
    assert not planner.allreduce_overlaps_backward("mwms", False)


@pytest.mark.parametrize("xla", [True, False])
def test_smddp_gets_the_gradients_at_once_only_from_an_xla_backward_pass(xla, monkeypatch):
    """SMDDP reduces gradients while the backward pass makes them (its documentation) when they come
    op by op; with XLA they all come out of one compiled call (the gradient of the compiled forward)."""
    import importlib
    import os

    from lm.distributed import get_strategy

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes"))
    for name in ("FAKE_SDP_RANK", "FAKE_SDP_SIZE", "FAKE_SDP_RENDEZVOUS"):
        monkeypatch.delenv(name, raising=False)
    sdp = importlib.import_module("smdistributed.dataparallel.tensorflow")
    assert "fakes" in sdp.__file__
    sdp._state["initialized"] = False
    try:
        graph, gradients = _train_step_graph(get_strategy("smddp").setup(), xla)
    finally:
        sdp._state["initialized"] = False
    backward = [op for op in graph.get_operations() if op.type.endswith("PartitionedCall")
                and len(op.outputs) == gradients + 2]  # the forward function's gradient: one per input
    assert len(backward) == 1
    assert backward[0].get_attr("_XlaMustCompile") == xla
    assert planner.allreduce_overlaps_backward("smddp", xla) == (not xla)
