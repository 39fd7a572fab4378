"""`python -m lm.data.prepare verify`: the one place every byte is hashed (training checks sizes only).

Exit status 0 when every shard and the tokenizer match the manifest, 1 with each problem named
when one does not, 2 when there is no manifest to verify against."""
import os
import subprocess
import sys

import pytest

from lm.data import prepare
from lm.spec import shards

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def dataset(corpus, tokenizer_file, tmp_path):
    output = str(tmp_path / "dataset")
    assert prepare.main([corpus[0], "--output", output, "--tokenizer", tokenizer_file, "--seq-len", "32",
                         "--shard-size", "8KiB", "--threads", "1", "--workers", "1"]) == 0
    return output


def flip_first_byte(path):
    with open(path, "r+b") as handle:
        first = handle.read(1)
        handle.seek(0)
        handle.write(bytes([first[0] ^ 1]))


def test_a_sound_dataset_verifies_with_status_0(dataset, capsys):
    assert prepare.main(["verify", dataset, "--workers", "2"]) == prepare.VERIFY_OK == 0
    manifest = shards.load_manifest(dataset)
    assert "%d shards" % len(manifest.shards) in capsys.readouterr().out


def test_every_corrupt_file_is_named_and_the_status_is_1(dataset, capsys):
    manifest = shards.load_manifest(dataset)
    flip_first_byte(os.path.join(dataset, manifest.shards[0].path))
    flip_first_byte(os.path.join(dataset, manifest.tokenizer_file))
    os.truncate(os.path.join(dataset, manifest.shards[1].path), 10)
    os.remove(os.path.join(dataset, manifest.shards[2].path))
    capsys.readouterr()
    assert prepare.main(["verify", dataset]) == prepare.VERIFY_PROBLEMS == 1
    captured = capsys.readouterr()
    errors = captured.err.splitlines()
    assert len(errors) == 4 and "4 problem(s)" in captured.out
    assert any(manifest.shards[0].path in line and "sha256" in line for line in errors)
    assert any(manifest.tokenizer_file in line and "sha256" in line for line in errors)
    assert any(manifest.shards[1].path in line and "10 bytes" in line for line in errors)
    assert any(manifest.shards[2].path in line and "missing" in line for line in errors)


def test_the_start_up_check_reads_sizes_not_bytes(dataset):
    manifest = shards.load_manifest(dataset)
    flip_first_byte(os.path.join(dataset, manifest.shards[0].path))
    shards.check(dataset, manifest)  # same size: only `verify` can see it
    os.truncate(os.path.join(dataset, manifest.shards[1].path), 10)
    with pytest.raises(shards.ShardError, match="%s: 10 bytes" % manifest.shards[1].path):
        shards.check(dataset, manifest)


def test_no_manifest_is_status_2_and_runs_as_a_module(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "training_image"))
    result = subprocess.run([sys.executable, "-m", "lm.data.prepare", "verify", str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 2 and "manifest.json" in result.stdout, result.stdout
