"""bench/checkpoint.py runs end to end at a tiny size and reports every mode (no timing is asserted)."""
import os

MODES = ("none", "sync", "device", "unpaced", "paced")


def test_checkpoint_bench_reports_every_writer_and_snapshot_at_a_tiny_size(tmp_path, run_bench):
    report, stdout = run_bench("checkpoint", "--layers", "1", "--d-model", "64", "--heads", "2", "--seq-len", "16",
                               "--batch", "2", "--vocab", "256", "--saves", "2", "--alone", "2",
                               "--noise-steps", "2", "--directory", str(tmp_path))
    assert sorted(report["results"]) == sorted(MODES)
    assert report["writer_share"] == 0.02 and report["target_fraction_of_step"] == 0.02
    assert report["device"] == "CPU:0"
    for mode in MODES[1:]:
        row = report["results"][mode]
        assert len(row["stall_per_save_all_s"]) == 2 and row["write_wall_s"] > 0 and row["writer_cpu_per_save_s"] > 0
        assert len(row["device_extra_bytes_all"]) == 2
        # lm.checkpoint's snapshot: NumPy copies of the whole state; the reference's: device tensors
        assert row["snapshot_host_bytes"] == (0 if mode == "device" else report["state_bytes"])
    assert "writer_cpu_per_save_s" not in report["results"]["none"]  # the noise floor: no writer
    assert [name for name in os.listdir(str(tmp_path)) if name.startswith("tmp")] == []  # its directory is removed
    for mode in MODES:
        assert mode in stdout
