"""`make demo` builds only what `python -m lmstack.demo` runs (issue 40 item 8): the Makefile's recipes for it, as
`make -n -B` prints them (every target out of date, as on a fresh clone), touch no virtual environment but .venv,
build no Horovod (the demo trains with MWMS; `lm` imports Horovod only for its strategy) and end with the demo."""
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _recipes(target):
    return subprocess.run(["make", "-n", "-B", "--no-print-directory", "-C", str(ROOT), target], capture_output=True,
                          text=True, check=True).stdout.splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_demo_builds_only_the_demos_environment_and_node_modules():
    lines = _recipes("demo")
    stamps = sorted(set(re.findall(r"^touch (\S+)$", "\n".join(lines), re.M)))
    assert stamps == [".venv/.installed", "node_modules/.installed"]
    assert not [line for line in lines if "horovod" in line.lower() and not line.startswith("#")]
    assert lines[-1] == ".venv/bin/python -m lmstack.demo"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_test_still_builds_every_environment_and_horovod():
    stamps = set(re.findall(r"^touch (\S+)$", "\n".join(_recipes("test")), re.M))
    assert {".venv/.installed", ".venv/.horovod", ".venv-tfcurrent/.installed", ".venv-tf26/.installed",
            ".venv-hf/.installed", ".venv-mlflow/.installed", "node_modules/.installed"} == stamps
