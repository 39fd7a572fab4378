"""bench/data_index.py runs end to end at a small size and reports every measurement (no timing is asserted)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_data_index_bench_reports_every_measurement_at_a_small_size(tmp_path):
    script = os.path.join(ROOT, "bench", "data_index.py")
    code = ("import sys; sys.argv[0] = %r; sys.path.insert(0, %r); import publish; "
            "publish.RESULTS_DIR = %r; import runpy; runpy.run_path(%r, run_name='__main__')"
            % (script, os.path.join(ROOT, "bench"), str(tmp_path), script))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-c", code, "--records", "100000", "--baseline-records", "20000",
                             "--directory", str(tmp_path / "data")],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(str(tmp_path / "data_index.json")) as handle:
        report = json.load(handle)
    assert sorted(report["results"]) == ["baseline_epoch_starts", "dry_run", "epoch_starts",
                                         "epoch_starts_at_baseline_size", "import_only"]
    assert "dataset" in report["results"]["dry_run"]["output"]
    for row in report["results"].values():
        assert row["wall_s"] > 0 and row["peak_rss_mib"] > 0
    shards = os.listdir(str(tmp_path / "data" / "big" / "train"))
    assert len(shards) == report["train_shards"] == 1  # 100,000 records of 4,098 bytes: under 1 GiB
