"""bench/data_index.py runs end to end at a small size and reports every measurement (no timing is asserted)."""
import os


def test_data_index_bench_reports_every_measurement_at_a_small_size(tmp_path, run_bench):
    report, _ = run_bench("data_index", "--records", "100000", "--baseline-records", "20000",
                          "--directory", str(tmp_path / "data"))
    assert sorted(report["results"]) == ["baseline_epoch_starts", "dry_run", "epoch_starts",
                                         "epoch_starts_at_baseline_size", "import_only"]
    assert "dataset" in report["results"]["dry_run"]["output"]
    for row in report["results"].values():
        assert row["wall_s"] > 0 and row["peak_rss_mib"] > 0
    shards = os.listdir(str(tmp_path / "data" / "big" / "train"))
    assert len(shards) == report["train_shards"] == 1  # 100,000 records of 4,098 bytes: under 1 GiB
