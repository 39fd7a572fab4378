"""Restart: a real SIGKILL mid-run, the same command again, and the bytes of an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from prepare_helpers import tree_bytes
from lmstack import sample_corpus
from lm.spec import shards

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INPUTS = 6
RECORD_BYTES = (32 + 1) * 2


def command(raw, output, tokenizer_file, workers):
    return [sys.executable, "-m", "lm.data.prepare", raw, "--output", output, "--tokenizer", tokenizer_file,
            "--seq-len", "32", "--shard-size", "2KiB", "--val-fraction", "0.1", "--workers", str(workers),
            "--threads", "1"]


def environment():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "training_image"), env.get("PYTHONPATH", "")])
    return env


def finished_inputs(output):
    try:
        with open(os.path.join(output, shards.MANIFEST_NAME)) as handle:
            return len(json.load(handle)["inputs"])
    except (OSError, ValueError):  # not written yet
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_killed_run_continues_to_the_bytes_of_an_uninterrupted_run(tokenizer_file, tmp_path, workers):
    raw = str(tmp_path / "raw")
    sample_corpus.write_sample_corpus(raw, max_bytes=INPUTS * 60000, files=INPUTS)
    reference, output = str(tmp_path / "reference"), str(tmp_path / "output")
    subprocess.run(command(raw, reference, tokenizer_file, workers), check=True, env=environment(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    process = subprocess.Popen(command(raw, output, tokenizer_file, workers), env=environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while finished_inputs(output) == 0 and process.poll() is None:
        time.sleep(0.005)
    assert process.poll() is None, "the run ended before it could be killed"
    children = psutil.Process(process.pid).children(recursive=True)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    # orphaned workers notice and stop on their own
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive
    done = finished_inputs(output)
    assert 1 <= done < INPUTS
    for root, _, files in os.walk(output):  # whatever is under a final name is whole records
        for name in files:
            if name.endswith(".bin"):
                assert os.path.getsize(os.path.join(root, name)) % RECORD_BYTES == 0

    rerun = subprocess.run(command(raw, output, tokenizer_file, workers), env=environment(),
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True)
    assert "resuming: %d of %d inputs already done" % (done, INPUTS) in rerun.stdout
    assert tree_bytes(output) == tree_bytes(reference)
    assert shards.load_manifest(output).prepare["complete"]
