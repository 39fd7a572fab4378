"""bench/hf_compare.py runs end to end at a tiny size in .venv-hf (no timing is asserted)."""
import json
import os
import subprocess

from test_hf_export import HF_PYTHON, ROOT, requires_hf_venv


@requires_hf_venv
def test_hf_compare_runs_at_a_tiny_size(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    script = os.path.join(ROOT, "bench", "hf_compare.py")
    code = ("import json, sys; sys.argv[0] = %r; sys.path.insert(0, %r); import publish; "
            "publish.RESULTS_DIR = %r; import runpy; runpy.run_path(%r, run_name='__main__')"
            % (script, os.path.join(ROOT, "bench"), str(tmp_path), script))
    result = subprocess.run([HF_PYTHON, "-c", code, "--preset", "tiny", "--new-tokens", "4", "--batch-sizes", "1",
                             "2", "--train-seq-len", "16", "--train-steps", "1", "--repeats", "2"],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "generate batch_2" in result.stdout and "train step, XLA on" in result.stdout
    with open(tmp_path / "hf_compare.json") as f:
        report = json.load(f)
    assert sorted(report["generation"]) == ["batch_1", "batch_2"]
    assert sorted(report["training"]) == ["xla_off", "xla_on"]
    rows = list(report["generation"].values()) + list(report["training"].values())
    for row in rows:
        assert row["ratio"] > 0 and row["median_ratio"] > 0
        assert row["lmstack_tokens_per_s"] >= row["lmstack_median_tokens_per_s"]  # the best round is the fastest
    for row in report["training"].values():
        assert 0 < row["lmstack_fraction_of_matmul"] and 0 < row["transformers_fraction_of_matmul"]
        assert row["ceiling_ratio"] == 1 / row["transformers_fraction_of_matmul"]
    assert "a step at the matmul rate would be" in result.stdout
