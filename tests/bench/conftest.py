"""Run a bench/ script end to end in a fresh process, its report kept in the test's directory."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def run_bench(tmp_path):
    """run_bench(name, *args): bench/<name>.py with `args`; (its published report as a dict
    (bench/publish.py, redirected to tmp_path), its stdout). Fails with its stderr when it exits non-zero."""
    def run(name, *args):
        script = os.path.join(ROOT, "bench", name + ".py")
        code = ("import sys; sys.argv[0] = %r; sys.path.insert(0, %r); import publish; "
                "publish.RESULTS_DIR = %r; import runpy; runpy.run_path(%r, run_name='__main__')"
                % (script, os.path.join(ROOT, "bench"), str(tmp_path), script))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        result = subprocess.run([sys.executable, "-c", code] + list(args), capture_output=True, text=True, env=env,
                                timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        with open(str(tmp_path / (name + ".json"))) as handle:
            return json.load(handle), result.stdout
    return run
