"""bench/gpu.py: the peak table, the batch search, and a CPU smoke run of the whole benchmark
(tiny preset, XLA on and off) that must report numbers for every configuration."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import gpu  # noqa: E402
from controlplane import throughput  # noqa: E402
from controlplane import planner  # noqa: E402
from lm.spec import hardware  # noqa: E402


@pytest.mark.parametrize("device_name, chip, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "H100 PCIe", "bf16", 756.0),
    ("NVIDIA H200", "H200", "bf16", 989.4),
    ("NVIDIA A100-SXM4-40GB", "A100", "bf16", 312.0),
    ("NVIDIA A10G", "A10G", "bf16", 125.0),
    ("NVIDIA L4", "L4", "bf16", 121.0),
    ("NVIDIA L40S", "L40S", "bf16", 362.0),
    ("Tesla V100-SXM2-16GB", "V100 SXM2", "fp16", 125.0),
    ("Tesla T4", "T4", "fp16", 65.0),
])
def test_peak_of_each_chip_by_its_cuda_name(device_name, chip, precision, tflops):
    found, peaks = gpu.gpu_peak(device_name)
    assert found == chip
    assert gpu.choose_precision("auto", peaks, on_gpu=True) == precision
    assert peaks[precision] == pytest.approx(tflops * 1e12)


def test_unknown_gpu_has_no_peak():
    assert gpu.gpu_peak("Some Future GPU") == (None, {})


def limited(capacity):
    def fits(batch):
        if batch > capacity:
            raise gpu.OutOfMemory(batch)
        return True
    return fits


def test_batch_doubles_until_out_of_memory_then_bisects_once():
    best, tried = gpu.search_batch(limited(12), max_batch=256)
    assert tried == [(1, True), (2, True), (4, True), (8, True), (16, False), (12, True)]
    assert best == 12
    best, tried = gpu.search_batch(limited(9), max_batch=256)
    assert (best, tried[-1]) == (8, (12, False))


def test_batch_search_stops_at_the_cap_and_reports_no_fit():
    assert gpu.search_batch(limited(1000), max_batch=4) == (4, [(1, True), (2, True), (4, True)])
    assert gpu.search_batch(limited(0), max_batch=4) == (0, [(1, False)])
    assert gpu.search_batch(limited(10), max_batch=256, fixed=6) == (6, [(6, True)])
    assert gpu.search_batch(limited(5), max_batch=256, fixed=6) == (0, [(6, False)])


@pytest.mark.slow
def test_cpu_smoke_run_reports_every_configuration(tmp_path):
    report_path = str(tmp_path / "gpu.json")
    result = subprocess.run(
        [sys.executable, os.path.join(BENCH, "gpu.py"), "--presets", "tiny", "--xla", "both", "--seq-len", "32",
         "--max-batch", "2", "--steps", "2", "--warmup", "1", "--repeats", "1", "--peak-tflops", "1",
         "--json", report_path],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=600)
    assert result.returncode == 0, result.stdout
    with open(report_path) as handle:
        report = json.load(handle)
    rows = report["results"]
    assert [(row["preset"], row["xla"]) for row in rows] == [("tiny", False), ("tiny", True)]
    for row in rows:
        assert row["batches_tried"] == [[1, True], [2, True]] and row["batch"] == 2
        assert row["precision"] == "bf16" and row["seq_len"] == 32 and row["device"] == "CPU"
        assert row["tokens_per_s"] == pytest.approx(2 * 32 / row["seconds_per_step"])
        assert row["mfu"] == pytest.approx(row["model_flops_per_s"] / 1e12)
    assert report["mfu_goal"] is None  # no goal for a CPU
    header = [line for line in result.stdout.splitlines() if line.startswith("preset")]
    assert header and "MFU" in header[0] and "batches tried" in header[0]


def test_every_chip_of_an_instance_type_is_filed_under_its_planner_gpu():
    filed = {gpu for _, _, _, gpu in gpu.PEAK_TFLOPS if gpu}
    assert filed <= set(hardware.GPUS)
    assert gpu.instance_gpu("H100 SXM") == "H100" and gpu.instance_gpu("H100 PCIe") is None


def test_record_keeps_the_best_mfu_per_instance_gpu_and_the_planner_then_assumes_it(tmp_path, monkeypatch):
    path = str(tmp_path / "measured_mfu.json")
    with open(path, "w") as handle:
        json.dump({"A100": {"mfu": 0.4, "preset": "gpt-350m", "precision": "bf16", "xla": True, "batch": 16,
                            "seq_len": 2048, "device": "NVIDIA A100-SXM4-40GB", "tensorflow": "2.15.1",
                            "date": "2027-01-01"}}, handle)
    row = {"preset": "gpt-1.3b", "precision": "bf16", "batch": 12, "seq_len": 2048, "device": "NVIDIA H100 80GB HBM3",
           "chip": "H100 SXM", "tensorflow": "2.15.1"}
    results = [dict(row, xla=False, mfu=0.33), dict(row, xla=True, mfu=0.36),
               dict(row, chip="H100 PCIe", device="NVIDIA H100 PCIe", xla=True, mfu=0.5),  # no instance type has it
               dict(row, chip=None, device="CPU", xla=True, mfu=None)]
    assert gpu.record_measurements(results, path, "2027-02-03") == ["H100"]
    table = planner.load_measured_mfu(path)
    assert sorted(table) == ["A100", "H100"] and table["H100"]["mfu"] == 0.36 and table["H100"]["xla"] is True
    assert table["H100"]["date"] == "2027-02-03"
    monkeypatch.setattr(planner, "MEASURED_MFU", table)
    mfu, source = planner.assumed_mfu("H100")
    assert mfu == 0.36 and source == ("measured by bench/gpu.py: gpt-1.3b, bf16, XLA on, batch 12 x 2048, "
                                      "NVIDIA H100 80GB HBM3, TensorFlow 2.15.1, 2027-02-03")
    assert planner.assumed_mfu("V100") == throughput.PUBLISHED_MFU["V100"]
    assert gpu.record_measurements(results[3:], path, "2027-02-04") == []
