"""Rules, arithmetic and the CLI of `controlplane.planner` (no TensorFlow)."""
import json
import math
import os
import subprocess
import sys

import pytest

from controlplane import throughput
from controlplane import base_images
from lmstack import plan
from controlplane import planner
from controlplane import prices
from lm.spec import hardware
from lm.spec import job
from controlplane.presets import ALL_PRESETS, get_preset
from lm.spec.families import flops_per_token, parameter_count

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_PARALLEL = ("mwms", "horovod", "smddp")


@pytest.fixture(scope="module")
def table():
    return planner.feasibility_table()


def test_the_feasibility_rows_follow_a_change_to_the_tables_they_read(table, monkeypatch):
    """feasibility_table keeps its rows while its inputs stay the same, and recomputes them when a table
    changes in place (a fork's or a test's edit): here the p4d's GPU memory."""
    assert planner.feasibility_table() == table
    row = _row(table, "gpt-6.7b", "ml.p4d.24xlarge", "single")
    assert not row["ok"] and "needs" in row["reason"]
    monkeypatch.setitem(hardware.INSTANCES, "ml.p4d.24xlarge",
                        hardware.INSTANCES["ml.p4d.24xlarge"]._replace(gpu_memory_gib=800))
    assert _row(planner.feasibility_table(), "gpt-6.7b", "ml.p4d.24xlarge", "single")["ok"]
    monkeypatch.undo()
    assert planner.feasibility_table() == table


def _row(table, preset, instance_type, strategy):
    (row,) = [r for r in table if (r["preset"], r["instance_type"], r["strategy"]) == (preset, instance_type, strategy)]
    return row


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "training_image"), env.get("PYTHONPATH", "")])
    return env


def test_imports_without_tensorflow():
    code = "import sys, controlplane.planner; controlplane.planner.feasibility_table(); assert 'tensorflow' not in sys.modules, sorted(sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0, result.stdout


# ---- the rules the state machine gets ----

def test_table_covers_every_preset_gpu_instance_and_strategy(table):
    gpu_types = [name for name, inst in hardware.INSTANCES.items() if inst.gpus]
    assert len(table) == len(ALL_PRESETS) * len(gpu_types) * len(job.STRATEGIES)  # every family's presets
    assert {r["instance_type"] for r in table} == set(gpu_types)
    for row in table:
        assert set(row) == {"preset", "instance_type", "strategy", "ok", "recompute_required", "reason",
                            "suggested_strategy", "suggestion"}
        assert (row["reason"] is None) == row["ok"]


@pytest.mark.parametrize("preset", list(ALL_PRESETS))
def test_every_preset_of_every_family_plans(preset):
    """No family-specific field is read: each preset plans on a GPU instance (fitting or not)."""
    result = planner.plan(preset, "ml.g5.12xlarge")
    config = get_preset(preset)
    assert result["model"]["params"] == parameter_count(config) and result["model"]["family"] == config.family
    assert result["chosen"]["memory_gib"]["peak"] > 0
    assert {c["strategy"] for c in result["candidates"]} == set(job.STRATEGIES)


def test_the_plan_reads_the_family_s_capabilities():
    """rnn declares neither smp nor recompute: the planner refuses both, naming the capability."""
    smp = planner.plan("rnn-tiny", "ml.p3.16xlarge", 1, "smp")["chosen"]
    assert not smp["ok"] and smp["reason"].startswith("model rnn cannot use strategy smp (capability smp:")
    recomputed = planner.plan("rnn-tiny", "ml.g5.xlarge", 1, "single", recompute=True)
    assert recomputed["chosen"]["reason"].startswith("model rnn cannot use hyperparameters.recompute true")
    assert planner.plan("rnn-tiny", "ml.g5.xlarge", 1, "single")["ok"]
    assert planner.plan("tiny", "ml.p3.16xlarge", 1, "smp", global_batch=8)["chosen"]["reason"] is None


def test_the_gate_plans_every_family(table):
    """The gate (controlplane.gate) refuses with the planner's words for rnn presets as for GPT presets
    (horovod's CUDA 11.2 image cannot run on H100s), and leaves the strategy rnn cannot use at all (smp) to
    the family's rule."""
    from controlplane import gate
    from stacks.settings import Settings

    row = _row(table, "rnn-small", "ml.p5.48xlarge", "horovod")
    assert not row["ok"] and "CUDA 11.2" in row["reason"] and row["suggested_strategy"] == "mwms"
    context = gate.Context(gate.Deployment.of(Settings()))
    config = {"preset": "rnn-small", "strategy": "horovod", "instance_type": "ml.p5.48xlarge",
              "hyperparameters": {"model": "rnn", "recompute": False, "global_batch_size": 8}}
    with pytest.raises(gate.Refusal, match=r"^lmstack.plan: horovod on 1 x ml.p5.48xlarge: .*CUDA 11.2") as refused:
        gate.decide(config, context)
    assert refused.value.error == "PlanRejected" and "suggestion: use strategy mwms" in str(refused.value)
    with pytest.raises(gate.Refusal, match="^model rnn cannot use strategy smp"):
        gate.decide(dict(config, strategy="smp", instance_type="ml.p3.16xlarge"), context)


def test_list_prints_every_preset_of_every_family_name_first():
    result = subprocess.run([sys.executable, "-m", "lmstack.plan", "--list"], cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(ALL_PRESETS)
    for line, config in zip(lines, ALL_PRESETS.values()):
        assert line.split()[1:3] == ["family", config.family]
    assert "12.9B parameters, " in lines[list(ALL_PRESETS).index("gpt-13b")]
    assert "64.1M parameters, " in lines[list(ALL_PRESETS).index("rnn-small")]


@pytest.mark.parametrize("strategy", DATA_PARALLEL)
def test_1_3b_plain_data_parallel_on_v100_16gb_does_not_fit_and_smp_is_suggested(table, strategy):
    row = _row(table, "gpt-1.3b", "ml.p3.16xlarge", strategy)
    assert not row["ok"]
    assert "GiB" in row["reason"] and "V100" in row["reason"]
    assert row["suggested_strategy"] == "smp"
    assert "smp" in row["suggestion"] and "partitions=" in row["suggestion"]
    assert _row(table, "gpt-1.3b", "ml.p3.16xlarge", "smp")["ok"]


def test_1_3b_does_not_fit_even_one_sequence_per_gpu_on_v100_with_data_parallel():
    # weights + gradients + AdamW alone are 16 bytes a parameter: more than a 16 GB V100 holds
    state = 16 * parameter_count(get_preset("gpt-1.3b"))
    assert state > planner.usable_bytes(hardware.get_instance("ml.p3.16xlarge"))
    verdict = planner.check("gpt-1.3b", "ml.p3.16xlarge", 2, "horovod", global_batch=4, seq_len=2048, recompute=True)
    assert not verdict.ok and verdict.suggested_strategy == "smp"  # 2 sequences per replica of 8 partitions


@pytest.mark.parametrize("strategy", ["smddp", "smp"])
def test_smdistributed_cannot_run_on_p5(table, strategy):
    row = _row(table, "gpt-125m", "ml.p5.48xlarge", strategy)
    assert not row["ok"]
    assert "runs only on" in row["reason"]
    assert row["suggested_strategy"] == "mwms"


def test_horovod_cannot_run_on_p5_because_its_image_predates_hopper(table):
    row = _row(table, "gpt-125m", "ml.p5.48xlarge", "horovod")
    assert not row["ok"]
    assert "CUDA 11.2" in row["reason"] and "11.8" in row["reason"]
    assert row["suggested_strategy"] == "mwms"
    assert _row(table, "gpt-125m", "ml.p5.48xlarge", "mwms")["ok"]


def test_cuda_versions_are_read_from_the_job_runtimes():
    assert planner.runtime_cuda("tf211") == (11, 2)
    assert planner.runtime_cuda("tfcurrent") == (12, 9)


def test_gpt_125m_fits_on_every_gpu_instance(table):
    for row in table:
        if row["preset"] != "gpt-125m":
            continue
        runs = planner.cannot_run(row["strategy"], row["instance_type"]) is None
        assert row["ok"] == runs, row
        assert not row["recompute_required"], row


def test_support_lists_come_from_lm_job(monkeypatch):
    assert not planner.check("gpt-125m", "ml.p5.48xlarge", 1, "smddp", global_batch=8).ok
    monkeypatch.setitem(job.STRATEGY_INSTANCE_TYPES, "smddp", job.SMDDP_INSTANCE_TYPES + ("ml.p5.48xlarge",))
    monkeypatch.setitem(base_images.STRATEGY_RUNTIME, "smddp", "tfcurrent")
    assert planner.check("gpt-125m", "ml.p5.48xlarge", 1, "smddp", global_batch=8).ok


def test_too_big_for_any_strategy_names_no_strategy(table):
    row = _row(table, "gpt-13b", "ml.g5.xlarge", "single")
    assert not row["ok"] and row["suggested_strategy"] is None
    assert "no strategy fits" in row["suggestion"]


def test_single_runs_on_one_instance_only():
    verdict = planner.check("gpt-125m", "ml.g5.xlarge", 2, "single", global_batch=4)
    assert not verdict.ok and "instance_count=2" in verdict.reason


def test_a_global_batch_smaller_than_the_data_parallel_size_is_raised_to_it_saying_so():
    chosen = planner.check("gpt-125m", "ml.p4d.24xlarge", 2, "horovod", global_batch=8).plan["chosen"]
    assert chosen["global_batch"] == 16 and chosen["per_replica_batch"] == 1
    assert "global_batch 8 is not a multiple of 16 (the data-parallel size)" in chosen["warnings"][0]
    assert "set hyperparameters.global_batch_size to 16" in chosen["warnings"][0]


@pytest.mark.parametrize("requested, picked", [(100, 96), (104, 112), (96, 96), (1, 16), (23, 16), (24, 32)])
def test_the_plan_picks_the_nearest_multiple_of_the_data_parallel_size(requested, picked):
    chosen = planner.check("gpt-125m", "ml.p4d.24xlarge", 2, "horovod", global_batch=requested).plan["chosen"]
    assert chosen["global_batch"] == picked
    assert any("planned with the nearest valid one, %d" % picked in w for w in chosen["warnings"]) == (
        requested != picked)


def test_auto_picks_the_cheapest_strategy_that_fits():
    result = planner.plan("gpt-125m", "ml.p4d.24xlarge", 1, "auto", global_batch=16)
    fitting = [c for c in result["candidates"] if c["ok"]]
    assert result["chosen"]["ok"] and len(fitting) > 1
    assert result["chosen"]["time"]["cost_on_demand_usd"] == min(c["time"]["cost_on_demand_usd"] for c in fitting)


def test_auto_leaves_smp_to_states_no_gpu_holds_even_where_its_model_costs_less():
    """At 8 sequences a GPU, data parallelism fits only with recomputation, whose extra forward pass
    makes it cost more in the model than SMP's pipeline; the plan chooses it all the same."""
    result = planner.plan("gpt-125m", "ml.p4d.24xlarge", 1, "auto", global_batch=64)
    chosen = result["chosen"]
    smp = next(c for c in result["candidates"] if c["strategy"] == "smp")
    assert chosen["ok"] and chosen["strategy"] in planner.DATA_PARALLEL and chosen["recompute"]
    assert smp["ok"] and smp["time"]["cost_on_demand_usd"] < chosen["time"]["cost_on_demand_usd"]


@pytest.mark.parametrize("preset", ["gpt-760m", "gpt-1.3b"])
def test_data_parallel_with_recomputation_is_chosen_over_smp_where_it_fits_one_a100(preset):
    """Issue 33, item 5: with the checkpoint snapshot in host memory, the data-parallel state and a
    recomputed block fit a 40 GB A100; the plan chooses it (recompute=true) although the request
    left recomputation off, and SMP, which fits without it, is not chosen."""
    result = planner.plan(preset, "ml.p4d.24xlarge")
    chosen = result["chosen"]
    assert result["ok"] and chosen["strategy"] in planner.DATA_PARALLEL and chosen["recompute"]
    assert chosen["memory_gib"]["peak"] < chosen["usable_gib"]
    assert result["suggested_strategy"] == chosen["strategy"] and result["suggested_recompute"] is True
    assert next(c for c in result["candidates"] if c["strategy"] == "smp")["ok"]
    snapshot = chosen["host_memory_gib"]["checkpoint_snapshot"]
    assert snapshot == pytest.approx(planner.CHECKPOINT_SNAPSHOT_BYTES * result["model"]["params"] / 2 ** 30)
    assert snapshot < chosen["host_memory_gib"]["usable"]


def test_smp_is_chosen_where_the_data_parallel_state_does_not_fit_one_gpu():
    """gpt-1.3b's weights, gradients and AdamW state (16 bytes a parameter, 19.6 GiB) exceed a 16 GB V100
    with or without recomputation: SMP, which splits them, is the plan."""
    result = planner.plan("gpt-1.3b", "ml.p3.16xlarge", 1, "auto", global_batch=8, seq_len=1024)
    assert result["chosen"]["strategy"] == "smp" and result["ok"]
    state = 16 * result["model"]["params"] / 2 ** 30
    assert state > next(c for c in result["candidates"] if c["strategy"] == "horovod")["usable_gib"]


# ---- memory ----

def test_state_bytes_per_parameter():
    config = get_preset("gpt-350m")
    p = parameter_count(config)
    fp32 = planner.memory(config, 1, 2048, "fp32")
    assert (fp32["weights"], fp32["gradients"], fp32["optimizer"], fp32["compute_copies"]) == (4 * p, 4 * p, 8 * p, 0)
    assert planner.memory(config, 1, 2048, "bf16")["compute_copies"] == 2 * p


def test_activations_grow_linearly_in_batch_and_attention_quadratically_in_length():
    config = get_preset("gpt-125m")
    one = planner.layer_activation_bytes(config, 1, 1024, 2)
    assert planner.layer_activation_bytes(config, 4, 1024, 2) == 4 * one
    u, w = 1024 * config.d_model, config.n_head * 1024 ** 2
    assert one == planner.MEASURED_U_ELEMENTS["graph"] * u * 2 + (4 + 2) * w
    assert planner.layer_activation_bytes(config, 1, 2048, 2) == 2 * planner.MEASURED_U_ELEMENTS["graph"] * u * 2 + 4 * 6 * w


def test_recomputation_keeps_one_block_plus_block_inputs():
    config = get_preset("gpt-760m")
    full = planner.memory(config, 2, 2048, "bf16")
    recomputed = planner.memory(config, 2, 2048, "bf16", recompute=True)
    assert recomputed["peak"] < full["peak"]
    u = 2 * 2048 * config.d_model
    block = planner.layer_activation_bytes(config, 2, 2048, 2)
    assert recomputed["activations_recompute"] == config.n_layer * u * 2 + int(block * (1 + planner.REBUILD_BACKWARD_SHARE))


def test_smp_partitions_split_parameters_and_microbatches_split_activations():
    result = planner.plan("gpt-2.7b", "ml.p4d.24xlarge", 1, "smp", global_batch=32, partitions=4, microbatches=8)
    smp = result["chosen"]
    config = get_preset("gpt-2.7b")
    assert smp["mp_parameters"]["partitions"] == 4 and smp["mp_parameters"]["microbatches"] == 8
    assert smp["data_parallel"] == 2 and smp["per_replica_batch"] == 16 and smp["micro_batch"] == 2
    assert parameter_count(config) / 4 < smp["params_per_gpu"] < parameter_count(config) / 2
    horovod = next(c for c in result["candidates"] if c["strategy"] == "horovod")
    assert smp["memory_gib"]["activations"] < horovod["memory_gib"]["activations"]


def test_smp_microbatches_must_divide_the_replica_batch():
    verdict = planner.check("gpt-350m", "ml.p4d.24xlarge", 1, "smp", global_batch=12, partitions=2, microbatches=4)
    chosen = verdict.plan["chosen"]
    assert verdict.ok and chosen["global_batch"] == 16 and chosen["per_replica_batch"] == 4
    assert "not a multiple of 16 (the data-parallel size x microbatches)" in chosen["warnings"][0]


# ---- time and cost ----

def test_tokens_per_second_follow_peak_times_mfu_over_flops_per_token():
    config = get_preset("gpt-350m")
    result = planner.plan("gpt-350m", "ml.p4d.24xlarge", 1, "mwms", global_batch=64, mfu=0.4)
    timing = result["chosen"]["time"]
    expected = 8 * hardware.GPUS["A100"].peak_flops["bf16"] * 0.4 / flops_per_token(config, 2048)
    assert timing["tokens_per_second"] == pytest.approx(expected)
    tokens = result["settings"]["tokens"]
    assert tokens == 20 * parameter_count(config)
    assert timing["hours"] == pytest.approx(tokens / expected / 3600)
    assert timing["cost_on_demand_usd"] == pytest.approx(timing["hours"] * prices.ON_DEMAND_USD_PER_HOUR["ml.p4d.24xlarge"])
    assert timing["cost_spot_usd"] == pytest.approx(timing["cost_on_demand_usd"] * (1 - prices.SPOT_DISCOUNT))


def test_default_mfu_is_per_gpu():
    timing = planner.plan("gpt-125m", "ml.p3.16xlarge", 1, "horovod", global_batch=8)["chosen"]["time"]
    assert timing["mfu"] == throughput.PUBLISHED_MFU["V100"][0]
    assert timing["peak_flops_per_gpu"] == hardware.GPUS["V100"].peak_flops["fp16"]


def test_twice_the_instances_halve_the_compute_and_the_all_reduce_comes_on_top():
    one = planner.plan("gpt-1.3b", "ml.p4d.24xlarge", 2, "mwms", global_batch=1024)["chosen"]["time"]
    two = planner.plan("gpt-1.3b", "ml.p4d.24xlarge", 4, "mwms", global_batch=1024)["chosen"]["time"]
    assert two["compute_seconds"] == pytest.approx(one["compute_seconds"] / 2)
    for timing in (one, two):
        assert timing["step_seconds"] == pytest.approx(timing["compute_seconds"] + timing["allreduce_seconds"])
    assert one["hours"] / 2 < two["hours"] < one["hours"]


def test_warns_when_the_global_batch_is_too_small_for_the_data_parallel_size():
    small = planner.plan("gpt-125m", "ml.p3.16xlarge", 4, "horovod", global_batch=32)["chosen"]
    assert any("global batch too small" in w for w in small["warnings"])
    assert small["time"]["allreduce_seconds"] > small["time"]["compute_seconds"]
    large = planner.plan("gpt-125m", "ml.p3.16xlarge", 4, "horovod", global_batch=4096)["chosen"]
    assert not any("global batch too small" in w for w in large["warnings"])


def test_recomputation_costs_time():
    plain = planner.plan("gpt-125m", "ml.p4d.24xlarge", 1, "mwms", global_batch=64)["chosen"]["time"]
    recomputed = planner.plan("gpt-125m", "ml.p4d.24xlarge", 1, "mwms", global_batch=64, recompute=True)["chosen"]["time"]
    assert recomputed["hours"] > plain["hours"]


def test_estimate_for_the_execution_output():
    estimate = planner.estimate("gpt-125m", "ml.p4d.24xlarge", 2, "horovod", global_batch=64)
    assert estimate["strategy"] == "horovod" and estimate["ok"]
    assert estimate["billable_instance_seconds"] == pytest.approx(2 * estimate["hours"] * 3600)
    assert estimate["cost_spot_usd"] < estimate["cost_on_demand_usd"]


def test_every_gpu_instance_has_a_price_a_gpu_and_a_network():
    for name, inst in hardware.INSTANCES.items():
        # A price that could not be sourced is listed as such, never guessed.
        assert (name in prices.UNPRICED) != (prices.on_demand_price(name) is not None)
        assert name in prices.UNPRICED or prices.on_demand_price(name) > 0
        assert throughput.NETWORK_GBPS[name] > 0
        if inst.gpus:
            gpu = hardware.get_gpu(inst.gpu)
            assert gpu.default_precision in gpu.peak_flops and inst.gpu in throughput.PUBLISHED_MFU


# ---- bad input ----

@pytest.mark.parametrize("kwargs, message", [
    (dict(model="gpt-9b"), "unknown preset 'gpt-9b'; allowed: tiny"),
    (dict(instance_type="ml.p9.large"), "unknown instance type 'ml.p9.large'; allowed:"),
    (dict(strategy="deepspeed"), "strategy must be one of auto, single"),
    (dict(precision="bf16", instance_type="ml.p3.16xlarge"), "precision 'bf16' is not supported on ml.p3.16xlarge"),
    (dict(precision="int8"), "precision must be one of auto, fp32, fp16, bf16"),
    (dict(instance_count=0), "instance_count must be a positive integer"),
    (dict(seq_len=4096), "seq_len 4096 exceeds the model's block_size 2048"),
    (dict(mfu=1.5), "mfu must be in (0, 1]"),
])
def test_bad_input_names_the_field(kwargs, message):
    args = dict(model="gpt-125m", instance_type="ml.g5.xlarge", instance_count=1, strategy="auto")
    args.update(kwargs)
    with pytest.raises(ValueError) as error:
        planner.plan(args.pop("model"), args.pop("instance_type"), args.pop("instance_count"), args.pop("strategy"),
                  **args)
    assert message in str(error.value)


def test_global_batch_in_tokens_or_sequences():
    assert plan.parse_global_batch("64", 2048) == 64
    assert plan.parse_global_batch("1M", 2048) == 512
    assert plan.parse_global_batch("512K", 1024) == 512
    with pytest.raises(ValueError, match="global batch"):
        plan.parse_global_batch("lots", 2048)
    assert plan.parse_tokens("26B") == 26 * 10 ** 9


# ---- the CLI ----

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "lmstack.plan"] + list(args), cwd=ROOT, env=_env(),
                          capture_output=True, text=True)


def test_cli_json():
    result = _cli("--preset", "gpt-125m", "--instance-type", "ml.p4d.24xlarge", "--instance-count", "2",
                  "--global-batch", "512K", "--tokens", "2.5B", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["ok"] and out["settings"]["global_batch"] == 256 and out["settings"]["tokens"] == 2500000000
    assert out["model"]["params"] == parameter_count(get_preset("gpt-125m"))
    assert {c["strategy"] for c in out["candidates"]} == set(job.STRATEGIES)
    memory = out["chosen"]["memory_gib"]
    for key in ("weights", "gradients", "optimizer", "activations", "activations_recompute", "peak"):
        assert memory[key] > 0
    assert out["chosen"]["time"]["cost_spot_usd"] < out["chosen"]["time"]["cost_on_demand_usd"]


def test_cli_table_and_exit_code_when_it_cannot_fit():
    result = _cli("--preset", "gpt-1.3b", "--instance-type", "ml.p3.16xlarge", "--strategy", "horovod",
                  "--global-batch", "2")
    assert result.returncode == 1
    assert "CANNOT" in result.stdout and "suggested strategy: smp" in result.stdout


def test_cli_bad_input_is_a_usage_error():
    result = _cli("--preset", "gpt-9b", "--instance-type", "ml.g5.xlarge")
    assert result.returncode == 2 and "unknown preset 'gpt-9b'" in result.stderr


def test_chart_is_a_png_of_time_and_cost_against_instance_count(tmp_path):
    path = tmp_path / "plan.png"
    points = plan.chart("gpt-125m", "ml.p4d.24xlarge", str(path), "mwms", counts=[1, 2, 4], global_batch=256)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p[0] for p in points] == [1, 2, 4]
    hours = [p[1] for p in points]
    assert hours[0] > hours[1] > hours[2]


def test_cli_writes_the_chart(tmp_path):
    path = tmp_path / "chart.png"
    result = _cli("--preset", "gpt-125m", "--instance-type", "ml.p4d.24xlarge", "--chart", str(path), "--json")
    assert result.returncode == 0, result.stderr
    assert path.stat().st_size > 1000 and json.loads(result.stdout)["chart"] == str(path)


def test_inter_container_traffic_encryption_slows_the_all_reduce_between_hosts_only():
    """SageMaker's train-encrypt page: slower for distributed deep learning, no effect on one host."""
    plain = planner.plan("gpt-125m", "ml.p3.16xlarge", 4, "horovod", global_batch=32)["chosen"]["time"]
    encrypted = planner.plan("gpt-125m", "ml.p3.16xlarge", 4, "horovod", global_batch=32,
                          traffic_encryption=True)["chosen"]["time"]
    assert encrypted["allreduce_seconds"] == pytest.approx(plain["allreduce_seconds"] * planner.ENCRYPTED_ALLREDUCE_SLOWDOWN)
    assert encrypted["compute_seconds"] == plain["compute_seconds"]
    assert encrypted["cost_on_demand_usd"] > plain["cost_on_demand_usd"]  # all-reduce bound at this batch
    one_host = [planner.plan("gpt-125m", "ml.p3.16xlarge", 1, "horovod", global_batch=32, traffic_encryption=on)
                ["chosen"]["time"] for on in (False, True)]
    assert one_host[0] == one_host[1]


def test_cli_json_reports_the_peak_learning_rate_the_run_uses():
    # gpt-6.7b at a 1M-token batch: GPT-3's 1.2e-4 (for 2M tokens), kept; with --scale-lr, Adam's
    # square-root rule: half the batch, 1/sqrt(2) of the rate.
    args = ("--preset", "gpt-6.7b", "--instance-type", "ml.p4d.24xlarge", "--instance-count", "8",
            "--global-batch", "1M", "--json")
    rate = json.loads(_cli(*args).stdout)["learning_rate"]
    assert rate["peak"] == pytest.approx(1.2e-4) and rate["gpt3_rate"] == 1.2e-4 and rate["gpt3_batch"] == 1024
    assert not rate["scale_lr"]
    scaled = json.loads(_cli(*args + ("--scale-lr",)).stdout)["learning_rate"]
    assert scaled["peak"] == pytest.approx(1.2e-4 / 2 ** 0.5) and scaled["scale_lr"]
    given = _cli("--preset", "gpt-125m", "--instance-type", "ml.p4d.24xlarge", "--global-batch", "1024",
                 "--learning-rate", "1e-3", "--no-scale-lr")
    assert "peak learning rate 0.001 (given 0.001 for GPT-3's batch of 256 sequences, kept at any batch)" in given.stdout


# ---- FLOPs per token and learning rate against the literature (issue 35) ----

# GPT-3 paper (Brown et al. 2020), Table 2.1: the peak learning rate of each size.
GPT3_RATES = {"gpt-125m": 6.0e-4, "gpt-350m": 3.0e-4, "gpt-760m": 2.5e-4, "gpt-1.3b": 2.0e-4, "gpt-2.7b": 1.6e-4,
              "gpt-6.7b": 1.2e-4, "gpt-13b": 1.0e-4}


def literature_flops_per_token(config, seq_len):
    """Written from the shapes, not from lm.spec.families: 6 x (matmul weights of the blocks + the
    output projection over the vocabulary, once) + 12 x layers x seq_len x attention width (PaLM,
    Chowdhery et al. 2022, appendix B). GPT-3: QKV and output projections 4d^2, MLP 8d^2. Llama:
    q and o d^2 each, k and v d x kv heads x head size each, SwiGLU 3 x d x d_ff."""
    d, layers = config.d_model, config.n_layer
    if config.family == "gpt":
        block = 12 * d * d
    else:
        block = 2 * d * d + 2 * d * config.n_kv_head * (d // config.n_head) + 3 * d * config.d_ff
    return 6 * (layers * block + config.vocab_size * d) + 12 * layers * seq_len * d


@pytest.mark.parametrize("preset", [name for name, config in ALL_PRESETS.items() if config.family in ("gpt", "llama")])
def test_flops_per_token_is_the_literature_count_everywhere_the_planner_reports_it(preset):
    config = get_preset(preset)
    seq_len = min(2048, config.block_size)
    result = planner.plan(preset, "ml.p4d.24xlarge", 1, "mwms", global_batch=8, seq_len=seq_len)
    expected = literature_flops_per_token(config, seq_len)
    assert result["model"]["flops_per_token"] == pytest.approx(expected, rel=0.02)
    assert result["chosen"]["time"]["flops_per_token"] == result["model"]["flops_per_token"]
    # The step's matmuls (checked against the traced graph in test_measured.py) are that count per token.
    assert planner.step_flops(config, 8, seq_len) == 8 * seq_len * flops_per_token(config, seq_len)


def test_the_cli_json_shows_the_literature_flops_and_a_rate_within_2x_of_gpt3s_for_gpt_and_llama():
    for preset in ("gpt-1.3b", "llama3.2-1b"):
        config = get_preset(preset)
        result = _cli("--preset", preset, "--instance-type", "ml.p5.48xlarge", "--global-batch", "8", "--seq-len", "2048",
                      "--json")
        assert result.returncode == 0, result.stderr
        shown = json.loads(result.stdout)
        assert shown["model"]["flops_per_token"] == pytest.approx(literature_flops_per_token(config, 2048), rel=0.02)
        nearest = min(GPT3_RATES, key=lambda name: abs(math.log(parameter_count(get_preset(name)) / shown["model"]["params"])))
        assert GPT3_RATES[nearest] / 2 <= shown["learning_rate"]["peak"] <= 2 * GPT3_RATES[nearest]


@pytest.mark.parametrize("preset", sorted(GPT3_RATES))
@pytest.mark.parametrize("global_batch", [8, 64, 256, 4096])
def test_the_peak_learning_rate_is_within_2x_of_gpt3s_for_the_size_at_any_batch(preset, global_batch):
    peak = planner.plan(preset, "ml.p4d.24xlarge", 8, "mwms", global_batch=global_batch)["learning_rate"]["peak"]
    assert GPT3_RATES[preset] / 2 <= peak <= 2 * GPT3_RATES[preset]


def test_the_mfu_is_stated_with_its_source_and_a_measurement_replaces_the_published_one(monkeypatch):
    timing = planner.plan("gpt-1.3b", "ml.p5.48xlarge", 1, "mwms", global_batch=64)["chosen"]["time"]
    assert (timing["mfu"], timing["mfu_source"]) == (0.418, throughput.PUBLISHED_MFU["H100"][1])
    assert "llm-foundry" in timing["mfu_source"]
    assert planner.plan("gpt-1.3b", "ml.p4d.24xlarge", 1, "mwms", global_batch=64)["chosen"]["time"]["mfu"] == 0.5
    monkeypatch.setitem(planner.MEASURED_MFU, "H100", {
        "mfu": 0.31, "preset": "gpt-1.3b", "precision": "bf16", "xla": True, "batch": 12, "seq_len": 2048,
        "device": "NVIDIA H100 80GB HBM3", "tensorflow": "2.15.1", "date": "2027-01-01"})
    measured = planner.plan("gpt-1.3b", "ml.p5.48xlarge", 1, "mwms", global_batch=64)["chosen"]["time"]
    assert measured["mfu"] == 0.31 and measured["mfu_source"].startswith("measured by bench/gpu.py: gpt-1.3b, bf16")
    assert measured["tokens_per_second"] == pytest.approx(timing["tokens_per_second"] * 0.31 / 0.418)
    given = planner.plan("gpt-1.3b", "ml.p5.48xlarge", 1, "mwms", global_batch=64, mfu=0.2)["chosen"]["time"]
    assert (given["mfu"], given["mfu_source"]) == (0.2, "given")


def test_no_measured_mfu_is_committed_without_its_gpu():
    assert set(planner.load_measured_mfu()) <= set(throughput.PUBLISHED_MFU) == set(hardware.GPUS)


def test_ampere_and_newer_default_to_bf16():
    assert [planner.resolve_precision("auto", hardware.get_instance(name)) for name in (
        "ml.g5.2xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.p3.2xlarge", "ml.g4dn.12xlarge")] == [
        "bf16", "bf16", "bf16", "fp16", "fp16"]
    assert all((gpu.default_precision == "bf16") == (gpu.generation not in ("volta", "turing"))
               for gpu in hardware.GPUS.values())


# ---- SMP: microbatch gradients and recomputation (issue 25 items 3 and 4) ----

def test_smp_counts_the_accumulator_and_one_microbatchs_gradients_beside_the_others_in_flight():
    # gpt-1.3b on ml.p3.16xlarge, 2 partitions, 16 microbatches: the step sums the microbatches'
    # gradients into one accumulator, and a microbatch's own gradients are made while the other
    # microbatch in flight (interleaved: min(16, 2)) keeps its activations.
    chosen = planner.plan("gpt-1.3b", "ml.p3.16xlarge", 10, "smp", global_batch=640, partitions=2,
                       microbatches=16)["chosen"]
    memory = chosen["memory_gib"]
    partition = chosen["params_per_gpu"] / 2 ** 30
    assert memory["gradient_accumulator"] == pytest.approx(4 * partition)
    assert memory["gradients"] == pytest.approx(4 * partition)
    assert chosen["host_memory_gib"]["checkpoint_snapshot"] == 0  # SMP saves through its library, synchronously
    one_microbatch = memory["activations"] / 2
    fixed = memory["weights"] + memory["optimizer"] + memory["gradient_accumulator"] + memory["compute_copies"]
    assert memory["peak"] == pytest.approx(fixed + max(memory["activations"] + memory["loss"],
                                                       one_microbatch + memory["gradients"]))
    assert not chosen["ok"]
    one = planner.plan("gpt-1.3b", "ml.p3.16xlarge", 10, "smp", global_batch=640, partitions=2,
                    microbatches=1)["chosen"]["memory_gib"]
    assert one["gradient_accumulator"] == 0  # one microbatch: its gradients are the step's


def test_the_simple_pipeline_keeps_every_microbatch_in_flight_the_interleaved_one_at_most_partitions():
    def activations(pipeline):
        return planner.plan("gpt-350m", "ml.p4d.24xlarge", 1, "smp", global_batch=16, partitions=2, microbatches=8,
                         pipeline=pipeline)["chosen"]["memory_gib"]["activations"]
    assert activations("simple") == pytest.approx(4 * activations("interleaved"))


def test_smp_with_recompute_is_refused_with_the_rule_and_the_plan_says_what_fits_without():
    verdict = planner.check("gpt-1.3b", "ml.p3.16xlarge", 2, "smp", global_batch=2, recompute=True)
    assert not verdict.ok and "hyperparameters.recompute must be false with strategy smp" in verdict.reason
    assert verdict.suggested_strategy == "smp" and "set recompute=false" in verdict.suggestion
    assert not verdict.plan["fits_with_recompute"]


def test_no_feasibility_row_makes_smp_need_recomputation(table):
    smp = [row for row in table if row["strategy"] == "smp"]
    assert smp and not any(row["recompute_required"] for row in smp)
    assert _row(table, "gpt-1.3b", "ml.p3.16xlarge", "smp")["ok"]  # one sequence per replica of 8 partitions


def test_the_seeds_run_gets_an_honest_rejection_naming_what_fits():
    # gpt-1.3b with SMP on 10 x ml.p3.16xlarge, 480 sequences of 2,048 tokens, no recomputation.
    verdict = planner.check("gpt-1.3b", "ml.p3.16xlarge", 10, "smp", global_batch=480)
    assert not verdict.ok
    assert "fits at seq_len 1024 with partitions=4, microbatches=24, pipeline=interleaved" in verdict.reason
    shorter = planner.check("gpt-1.3b", "ml.p3.16xlarge", 10, "smp", global_batch=480, seq_len=1024)
    assert shorter.ok and shorter.plan["chosen"]["mp_parameters"] == {
        "partitions": 4, "microbatches": 24, "pipeline": "interleaved", "horovod": True, "auto_partition": False,
        "default_partition": 0}
    given = planner.check("gpt-1.3b", "ml.p3.16xlarge", 10, "smp", global_batch=480, seq_len=1024, partitions=2,
                       microbatches=12)
    assert not given.ok and "fits with partitions=4, microbatches=24, pipeline=interleaved" in given.reason


# ---- the checkpoint snapshot (item 8) ----

@pytest.mark.parametrize("strategy", ["single", "mwms", "horovod", "smddp"])
def test_a_checkpoints_copy_of_the_state_is_counted_in_the_chiefs_host_memory(strategy):
    config = get_preset("gpt-1.3b")
    batch = 1 if strategy == "single" else 8
    chosen = planner.plan("gpt-1.3b", "ml.p4d.24xlarge", 1, strategy, global_batch=batch, recompute=True)["chosen"]
    assert chosen["host_memory_gib"]["checkpoint_snapshot"] == pytest.approx(
        planner.CHECKPOINT_SNAPSHOT_BYTES * parameter_count(config) / 2 ** 30)
    assert "checkpoint_snapshot" not in chosen["memory_gib"]
    assert chosen["ok"]  # 16 bytes a parameter and a rebuilt block fit a 40 GB A100; 13 more on the GPU did not


def test_a_snapshot_the_chiefs_host_cannot_hold_is_refused_naming_host_memory(monkeypatch):
    """The same run on a p4d with 40 GiB of host memory: 40 x 0.9 - 8 x 4 GiB leaves 4 GiB for gpt-1.3b's
    14.7 GiB snapshot. The GPUs would hold the run, so the reason is the host's."""
    monkeypatch.setitem(hardware.INSTANCES, "ml.p4d.24xlarge",
                        hardware.INSTANCES["ml.p4d.24xlarge"]._replace(memory_gib=40))
    verdict = planner.check("gpt-1.3b", "ml.p4d.24xlarge", 1, "horovod", global_batch=8, recompute=True)
    assert not verdict.ok
    assert "checkpoint snapshot needs 14.7 GiB of the chief's host memory, ml.p4d.24xlarge has 4.0 GiB for it" \
        in verdict.reason
    smp = planner.check("gpt-1.3b", "ml.p4d.24xlarge", 1, "smp", global_batch=8)
    assert smp.ok and smp.plan["chosen"]["host_memory_gib"]["checkpoint_snapshot"] == 0


def test_without_gpus_the_snapshot_shares_the_host_memory_with_training():
    config = get_preset("gpt-125m")
    layout = planner.plan(config, "ml.m5.xlarge", 1, "single", global_batch=1, seq_len=128, precision="fp32")["chosen"]
    host = layout["host_memory_gib"]
    assert host["usable"] == pytest.approx(layout["usable_gib"] - layout["memory_gib"]["peak"])
    assert host["checkpoint_snapshot"] == pytest.approx(12 * parameter_count(config) / 2 ** 30)


def test_the_gpu_holds_no_snapshot_and_smp_none_anywhere():
    config = get_preset("gpt-350m")
    assert "checkpoint_snapshot" not in planner.memory(config, 1, 2048, "bf16")
    instance = hardware.get_instance("ml.p4d.24xlarge")
    for strategy in job.STRATEGIES:
        snapshot = planner.host_memory(config, instance, strategy, 0)["checkpoint_snapshot"]
        assert snapshot == (12 * parameter_count(config) if strategy in planner.SNAPSHOT_STRATEGIES else 0)


# ---- the clock (item 9) ----

@pytest.mark.parametrize("strategy, xla, overlapped", [
    ("horovod", True, False), ("horovod", False, False), ("mwms", True, False), ("mwms", False, False),
    ("smddp", True, False), ("smddp", False, True), ("smp", True, False)])
def test_the_all_reduce_follows_the_backward_pass_unless_the_code_path_overlaps_them(strategy, xla, overlapped):
    preset, instance_type = ("gpt-125m", "ml.p4d.24xlarge")
    settings = dict(global_batch=256, xla=xla, partitions=2 if strategy == "smp" else None)
    timing = planner.plan(preset, instance_type, 4, strategy, **settings)["chosen"]["time"]
    assert timing["allreduce_overlaps_backward"] is overlapped
    compute, allreduce = timing["compute_seconds"], timing["allreduce_seconds"]
    assert allreduce > 0
    assert timing["step_seconds"] == pytest.approx(max(compute, allreduce) if overlapped else compute + allreduce)


def test_the_plan_assumes_lm_trains_xla_default():
    assert planner.plan("gpt-125m", "ml.p4d.24xlarge", 2, "smddp")["settings"]["xla"] is job.HYPERPARAMETERS["xla"].default
    assert not _cli("--preset", "gpt-125m", "--instance-type", "ml.p4d.24xlarge", "--strategy", "smddp",
                    "--instance-count", "2", "--no-xla", "--json").returncode


def test_botocore_training_instance_types_of_today_are_planned():
    """Issue 27: the GPU types botocore's TrainingInstanceType lists today reach the planner."""
    import botocore.session
    enum = botocore.session.get_session().get_service_model("sagemaker").shape_for("TrainingInstanceType").enum
    today = ("ml.p5.4xlarge", "ml.p5e.48xlarge", "ml.p5en.48xlarge", "ml.p6-b200.48xlarge",
             "ml.g6.xlarge", "ml.g6.48xlarge", "ml.g6e.xlarge", "ml.g6e.48xlarge")
    assert set(hardware.INSTANCES) <= set(enum)
    for name in today:
        chosen = planner.plan("gpt-125m", name, 1, "auto", global_batch=8, recompute=True)["chosen"]
        assert chosen["ok"] and chosen["time"]["hours"] > 0, (name, chosen["reason"])
        assert chosen["time"]["cost_on_demand_usd"] is None  # no sourced price: no cost, not a guess
    # Horovod's image (CUDA 11.2) cannot drive Blackwell; MWMS on the TF 2.21 image (CUDA 12.9) can.
    assert "CUDA 12.8" in planner.cannot_run("horovod", "ml.p6-b200.48xlarge", 2)
    assert planner.cannot_run("mwms", "ml.p6-b200.48xlarge", 2) is None
    assert planner.cannot_run("smddp", "ml.p5en.48xlarge", 2)  # SMDDP keeps its library's own list


def test_training_plan_price_replaces_the_on_demand_price():
    priced = planner.plan("gpt-125m", "ml.p5.4xlarge", 1, "single", usd_per_instance_hour=10.0)["chosen"]["time"]
    assert priced["cost_on_demand_usd"] == pytest.approx(priced["hours"] * 10.0)
    table = plan.format_table(planner.plan("gpt-125m", "ml.p5.4xlarge", 1, "single"))
    assert "$- on demand" in table


# ---- the deployment's settings, as lmstack.start and the gate read them (issue 40 item 10) ----

MULTI_HOST = ["--preset", "gpt-125m", "--instance-type", "ml.p3.16xlarge", "--instance-count", "4",
              "--strategy", "horovod", "--global-batch", "32", "--recompute", "--json"]


def _planned(argv, capsys):
    status = plan.main(argv)
    return status, json.loads(capsys.readouterr().out)


def _cdk_json(tmp_path, **settings):
    path = tmp_path / "cdk.json"
    path.write_text(json.dumps({"context": {"lmstack": settings}}))
    return str(path)


def test_the_plan_takes_traffic_encryption_and_spot_from_the_deployment_and_says_so(tmp_path, capsys):
    encrypted = _cdk_json(tmp_path, inter_container_traffic_encryption=True, spot=True)
    _, used = _planned(MULTI_HOST + ["--cdk-json", encrypted], capsys)
    assert used["deployment"]["inter_container_traffic_encryption"] == {"value": True, "from": os.path.relpath(encrypted)}
    assert used["deployment"]["spot"]["value"] is True and used["settings"]["spot"] is True
    _, plain = _planned(MULTI_HOST + ["--cdk-json", encrypted, "--no-traffic-encryption", "--no-spot"], capsys)
    assert plain["deployment"]["inter_container_traffic_encryption"] == {"value": False,
                                                                         "from": "--no-traffic-encryption"}
    assert plain["chosen"]["time"]["hours"] < used["chosen"]["time"]["hours"]
    assert plan.main(MULTI_HOST[:-1] + ["--cdk-json", encrypted]) == 0
    assert capsys.readouterr().out.startswith(
        "deployment: %s; inter_container_traffic_encryption true, spot true\n" % os.path.relpath(encrypted))


def test_an_input_is_planned_as_the_gate_plans_it_and_its_refusal_is_exit_status_1(tmp_path, capsys):
    from controlplane import gate
    from stacks.settings import Settings

    cdk_json = _cdk_json(tmp_path, inter_container_traffic_encryption=False)
    run = {"preset": "gpt-125m", "strategy": "horovod", "instance_type": "ml.p3.16xlarge", "instance_count": 4,
           "hyperparameters": {"global_batch_size": 32, "recompute": True, "max_steps": 3000}}
    status, result = _planned(["--input", json.dumps(run), "--cdk-json", cdk_json, "--json"], capsys)
    decided = gate.decide(run, gate.Context(gate.Deployment.of(Settings(inter_container_traffic_encryption=False))))
    assert status == 0 and result["gate"]["accepted"] and result["gate"]["plan"]["hours"] == decided.plan["hours"]
    assert result["chosen"]["time"]["hours"] == decided.plan["hours"]
    too_big = dict(run, hyperparameters={"global_batch_size": 512, "recompute": False})
    assert plan.main(["--input", json.dumps(too_big), "--cdk-json", cdk_json]) == 1
    assert "\ngate: refused, PlanRejected: lmstack.plan: horovod on 4 x ml.p3.16xlarge: needs" in capsys.readouterr().out
