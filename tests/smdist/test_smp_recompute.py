"""SMP and tf.recompute_grad: why lm.training.train refuses `recompute` with strategy smp.

SMP v1 ranks other than the tracing one do not trace the model: they import the GraphDef rank 0
traced and serialized (smdistributed/modelparallel/tensorflow/v2/model.py, lines 228-235, and
v2/serialization.py, `import_graph`, in the library's 1.12.1 source). tf.recompute_grad's
backward pass is a custom gradient that exists only in the registry of the process that traced
it. The first test shows this with TensorFlow alone, in two processes; the others show the fake
(tests/fakes) and lm.training.train refusing it."""
import json
import subprocess
import sys

import pytest

from controlplane import presets
from lm.distributed import get_strategy
from smdist_helpers import train

# Traces the graph of each block of argv[2:] (plain, recompute) into DIRECTORY/<block>.pb; prints "<block> <output>".
TRACE = r"""
import os, sys
from lm.compat import tf

def block(h):
    return tf.tanh(h) * 2.0

def traced(recompute):
    @tf.function
    def forward(x):
        return tf.reduce_sum(tf.recompute_grad(block)(x) if recompute else block(x))
    return forward.get_concrete_function(tf.TensorSpec([2, 3], tf.float32, name="x")).graph

for name in sys.argv[2:]:
    graph = traced(name == "recompute")
    with open(os.path.join(sys.argv[1], name + ".pb"), "wb") as handle:
        handle.write(graph.as_graph_def().SerializeToString())
    print(name, graph.outputs[0].name)
"""

# Imports each graph DIRECTORY/<block>.pb of argv[2:] ("<block> <output>") and asks for its gradient; prints
# "<block> gradients" or "<block> LookupError: ...".
IMPORT = r"""
import os, sys
from lm.compat import tf

for traced in sys.argv[2:]:
    name, output = traced.split()
    graph_def = tf.compat.v1.GraphDef()
    with open(os.path.join(sys.argv[1], name + ".pb"), "rb") as handle:
        graph_def.ParseFromString(handle.read())
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3])
        loss, = tf.graph_util.import_graph_def(graph_def, input_map={"x:0": x}, return_elements=[output])
        try:
            tf.gradients(loss, x)
            print(name, "gradients")
        except LookupError as error:
            print(name, "LookupError: %s" % error)
"""
BLOCKS = ("plain", "recompute")


def _python(code, *args):
    result = subprocess.run([sys.executable, "-c", code] + list(args), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line.startswith(BLOCKS)]


@pytest.fixture(scope="module")
def imported_in_another_process(tmp_path_factory):
    """{block: what asking for the gradient said} of both graphs, traced in one process and imported in
    another (one TensorFlow start-up per process for both blocks)."""
    directory = str(tmp_path_factory.mktemp("graphs"))
    traced = _python(TRACE, directory, *BLOCKS)
    return dict(line.split(" ", 1) for line in _python(IMPORT, directory, *traced))


@pytest.mark.parametrize("block, expected", [("plain", "gradients"), ("recompute", "LookupError: No gradient "
                                                                                      "defined for operation")])
def test_a_graph_traced_with_recompute_grad_has_no_gradient_in_another_process(imported_in_another_process, block,
                                                                               expected):
    assert imported_in_another_process[block].startswith(expected)


def _train_with_recompute():
    strategy = get_strategy("smp").setup()
    strategy.build_model = lambda build_fn, build=strategy.build_model: build(
        lambda **options: build_fn(recompute=True, **options))
    train(strategy, steps=1, batch=8)


def test_the_fake_refuses_recompute_grad_on_the_ranks_that_import_the_graph(fake_smdist, monkeypatch):
    import smdistributed.modelparallel.tensorflow as smp
    monkeypatch.setenv("SM_HP_MP_PARAMETERS", json.dumps(dict(partitions=2, microbatches=2, auto_partition=False,
                                                              default_partition=0)))
    # A LookupError, which autograph may report as a StagingError around it (raised in a tf.function).
    with pytest.raises(Exception, match="No gradient defined for operation .*mp_rank > 0 imports the graph"):
        smp.run_ranks(2, _train_with_recompute)


def test_lm_train_refuses_recompute_with_smp_before_any_job():
    from lm.training.train import parse_args
    # The rule table's strategy.smp.recompute, run by validate_hyperparameters (ValueError, as every
    # hyperparameter check; lm.training.train's main reports it before any work).
    with pytest.raises(ValueError, match="hyperparameters.recompute must be false with strategy smp"):
        parse_args(["--strategy", "smp", "--recompute", "true", "--data-dir", "x"])
    with pytest.raises(ValueError, match=r"model rnn cannot use strategy smp \(capability smp: .*\); families with it: gpt"):
        parse_args(["--strategy", "smp", "--model", "rnn", *presets.train_arguments("rnn-tiny"), "--data-dir", "x"])
    hyperparameters, _ = parse_args(["--strategy", "horovod", "--recompute", "true", *presets.train_arguments("tiny"),
                                     "--data-dir", "x"])
    assert hyperparameters.recompute
