"""`controlplane.planner`'s memory and FLOPs model against a real training step of `lm.models.gpt` and
`lm.models.llama` on the CPU.

Each case runs tests/plan/measure.py in a fresh process (see its docstring for the method:
TensorFlow's BFC allocator peak of a step (the median of a few), and the matmul FLOPs counted from the traced
forward+backward graph) and compares with what the planner predicts for the same config.
"""
import json
import os
import subprocess
import sys

import pytest

from controlplane import planner
from controlplane.presets import get_preset
from lm.spec.families import GPTConfig, LlamaConfig, RNNConfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SMALL = GPTConfig(n_layer=4, d_model=256, n_head=4, block_size=256, vocab_size=4096)
# The Llama family's block (RMSNorm, rotary, grouped-query attention, SwiGLU) at the same size.
LLAMA_SMALL = LlamaConfig(n_layer=4, d_model=256, n_head=4, n_kv_head=2, d_ff=688, block_size=256, vocab_size=4096)
# Wider, at a small batch: the update (weights, m, v, the gradients and their clipped copies) is
# the peak, not the activations. A planner that left out the clipped copies was 20 % under it.
UPDATE_BOUND = GPTConfig(n_layer=4, d_model=512, n_head=4, block_size=256, vocab_size=4096)
TOLERANCE = 0.15
# The planner may be further above the peak than below it. Its update term is the bound where every gradient and its
# clipped copy are alive at once; TensorFlow's executor frees a gradient once its clipped copy is made, in an order
# that varies from step to step and from machine to machine. At the update-bound shape one process's steps peaked
# from 243.7 to 264.5 MiB here (the planner 283.0 MiB: 7 to 16 % above), and CI's machine gave a median of 243.7.
# Below the peak (where a plan would run out of memory) the tolerance stays 15 %.
OVER_TOLERANCE = 0.25

CASES = {
    "tiny": dict(config=get_preset("tiny"), batch=32, seq_len=128, recompute=False),
    "small": dict(config=SMALL, batch=8, seq_len=256, recompute=False),
    "small-recompute": dict(config=SMALL, batch=8, seq_len=256, recompute=True),
    "llama-small": dict(config=LLAMA_SMALL, batch=8, seq_len=256, recompute=False),
    "llama-small-recompute": dict(config=LLAMA_SMALL, batch=8, seq_len=256, recompute=True),
    "update-bound": dict(config=UPDATE_BOUND, batch=2, seq_len=64, recompute=False),
}


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "training_image"), env.get("PYTHONPATH", "")])
    return env


def measure(case):
    spec = dict(case, config=case["config"].to_dict())
    result = subprocess.run([sys.executable, os.path.join(HERE, "measure.py"), json.dumps(spec)], cwd=ROOT,
                            env=_env(), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def update_bound_with_snapshot():
    """measure.py at the update-bound shape, a snapshot held after its plain steps: both peaks of one process."""
    return measure(dict(CASES["update-bound"], snapshot=True))


@pytest.fixture(scope="module", params=sorted(CASES))
def measured(request):
    case = CASES[request.param]
    if request.param == "update-bound":
        # measure.py measures its plain steps before it takes the snapshot, as without one.
        held = request.getfixturevalue("update_bound_with_snapshot")
        return case, dict(held, peak_bytes=held["plain_peak_bytes"])
    return case, measure(case)


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_rnn_memory_estimate_is_within_15_percent_of_the_allocator_peak(cell):
    """The RNN family's block_activation_bytes (lm.spec.families.rnn) through the same planner.memory."""
    case = dict(config=RNNConfig(n_layer=6, d_model=256, block_size=256, vocab_size=4096, cell=cell), batch=16,
                seq_len=128, recompute=False)
    result = measure(case)
    assert result["params"] == case["config"].parameter_count()
    predicted = planner.memory(case["config"], case["batch"], case["seq_len"], "fp32")["peak"]
    error = predicted / float(result["peak_bytes"]) - 1.0
    assert abs(error) <= TOLERANCE, "predicted %.1f MiB, measured %.1f MiB (%+.1f %%)" % (
        predicted / 2 ** 20, result["peak_bytes"] / 2 ** 20, 100 * error)


# A process whose executor queued ops differently all along (measure.py's docstring: which ops are queued follows op
# timings, and a loaded machine changes them) peaks higher in every step, so the median of its steps does not leave
# it out: one process of the full suite on 2 busy cores gave the Llama recompute case 191.5 MiB where 3 processes
# alone gave 150.4 to 158.7. Outside the bounds, the case is measured in two more processes and the median of the
# three is compared: one such process is left out, a planner that is wrong is not.
MORE_PROCESSES = 2


def _peak_error(predicted, peak):
    return predicted / float(peak) - 1.0


@pytest.mark.slow
def test_predicted_peak_memory_within_15_percent_below_and_25_above_the_allocator_peak(measured):
    case, result = measured
    predicted = planner.memory(case["config"], case["batch"], case["seq_len"], "fp32", recompute=case["recompute"])
    peaks = [result["peak_bytes"]]
    if not -TOLERANCE <= _peak_error(predicted["peak"], peaks[0]) <= OVER_TOLERANCE:
        peaks += [measure(case)["peak_bytes"] for _ in range(MORE_PROCESSES)]
    peak = sorted(peaks)[len(peaks) // 2]
    error = _peak_error(predicted["peak"], peak)
    assert -TOLERANCE <= error <= OVER_TOLERANCE, "predicted %.1f MiB, measured %s MiB (median %+.1f %%)" % (
        predicted["peak"] / 2 ** 20, ", ".join("%.1f" % (value / 2 ** 20) for value in peaks), 100 * error)


@pytest.mark.slow
def test_predicted_step_flops_equal_the_counted_graph_flops(measured):
    case, result = measured
    assert planner.step_flops(case["config"], case["batch"], case["seq_len"], case["recompute"]) == result["matmul_flops"]


@pytest.mark.slow
def test_parameter_count_equals_the_built_model(measured):
    case, result = measured
    config = case["config"]
    assert planner.plan(config, "ml.g5.xlarge", seq_len=case["seq_len"])["model"]["params"] == result["params"]
    # and the persistent state the planner charges (weights + m + v) is what stays allocated
    state = planner.memory(config, case["batch"], case["seq_len"], "fp32")
    assert result["resident_bytes"] >= state["weights"] + state["optimizer"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", "gpt-1.3b"])
def test_parameter_count_agrees_with_lmstack_plan_describe(preset):
    result = subprocess.run([sys.executable, "-m", "lmstack.plan", "--describe", preset], cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    described = json.loads(result.stdout)
    assert planner.plan(preset, "ml.p4d.24xlarge")["model"]["params"] == described["params"]


@pytest.mark.slow
def test_a_held_checkpoint_snapshot_is_in_host_memory_where_the_plan_counts_it(update_bound_with_snapshot):
    """A step taken while lm.checkpoint's snapshot of the state is held (a background save whose
    writer has not yet written the file): the snapshot is NumPy arrays of the weights and AdamW's m
    and v, CHECKPOINT_SNAPSHOT_BYTES a parameter of host memory, and TensorFlow's allocator peak does
    not rise (it rose by 11.3 to 13.9 bytes a parameter while the snapshot held the reads on the
    device). Both peaks come from one process (measure.py) at the update-bound shape, whose state is
    large next to the activations' step-to-step spread."""
    case, held = CASES["update-bound"], update_bound_with_snapshot
    state = planner.CHECKPOINT_SNAPSHOT_BYTES * held["params"]
    # the state and AdamW's step counter (8 bytes)
    assert state <= held["snapshot_host_bytes"] <= state + 64, (held["snapshot_host_bytes"], state)
    # within the steps' spread (about 10 MiB here, under a byte a parameter), far from a device copy's 12
    device_per_parameter = (held["peak_bytes"] - held["plain_peak_bytes"]) / float(held["params"])
    assert abs(device_per_parameter) < 3.0, device_per_parameter
    predicted = planner.memory(case["config"], case["batch"], case["seq_len"], "fp32")["peak"]
    assert -TOLERANCE <= predicted / float(held["peak_bytes"]) - 1.0 <= OVER_TOLERANCE, (predicted, held["peak_bytes"])
