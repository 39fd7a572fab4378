"""The data index at the Pile's size: start-up time and peak memory of `lm.data.dataset` on 10^8 records.

    python bench/data_index.py [--records 100000000] [--seq-len 2048] [--baseline-records 10000000]

Writes a dataset whose shards are sparse files of the right size (no token is ever read: the
index is built from the manifest's counts) and measures, each in a fresh process (peak RSS from
the child's rusage, wall time around it):

- `dry_run`: `python -m lm.training.train --dry-run` on it (Horovod, 8 x ml.p4d.24xlarge: 64 data-parallel
  ranks, the train and val streams opened as `lm.training.train` opens them);
- `import_only`: the same process importing what the dry run imports, without the dataset
  (the floor both figures stand on);
- `epoch_starts`: one TokenStream of a single rank (the whole global batch: the old index's worst
  case), then the first chunk of reads of epoch 0 and of
  epoch 1 (an epoch boundary: the block permutation is drawn);
- `baseline_epoch_starts`: the same with `lm/data.py` as of `--baseline-rev` (the whole-epoch
  index) at `--baseline-records` records (its memory grows with the records: at 10^8 it needs
  several GiB).

Prints a table and JSON; writes bench/results/data_index.json.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training_image"))
sys.path.insert(0, ROOT)  # controlplane.presets: the presets are the control plane's

from publish import publish  # noqa: E402

from controlplane import presets  # noqa: E402
from lm.spec import shards  # noqa: E402

EPOCH_STARTS = """
import sys, time
sys.path.insert(0, sys.argv[1])
import {module} as data
stream = data.TokenStream(sys.argv[2], "train", global_batch_size=512, seed=1234)
for epoch in (0, 1):
    {first_chunk}
"""
NEW_FIRST_CHUNK = "next(stream.chunk_runs(epoch, 0))"
OLD_FIRST_CHUNK = "stream._chunk_runs(epoch, 0)[0]"


def sparse_dataset(directory, records, seq_len=2048, shard_bytes=1 << 30, val_records=None):
    """A dataset directory whose shards are sparse files of the sizes its manifest gives (zeros if read)."""
    dtype = shards.dtype_for_vocab(50257)
    record_bytes = shards.record_bytes(seq_len, dtype)
    per_shard = max(1, shard_bytes // record_bytes)
    tokenizer = os.path.join(directory, "tokenizer.json")
    with open(tokenizer, "w") as handle:
        handle.write("{}")
    manifest = shards.Manifest(dtype=dtype, seq_len=seq_len, vocab_size=50257, eod_token_id=50256,
                               tokenizer_file="tokenizer.json", tokenizer_sha256=shards.sha256_file(tokenizer))
    val_records = max(1, records // 200) if val_records is None else val_records
    for split, count in (("train", records), ("val", val_records)):
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        for index, start in enumerate(range(0, count, per_shard)):
            size = min(per_shard, count - start)
            relative = "%s/%05d.bin" % (split, index)
            with open(os.path.join(directory, relative), "wb") as handle:
                handle.truncate(size * record_bytes)
            manifest.shards.append(shards.Shard(path=relative, split=split, records=size,
                                                bytes=size * record_bytes, sha256="0" * 64))
    shards.save_manifest(directory, manifest)
    return manifest


def measured(command, env=None):
    """(wall seconds, peak RSS MiB, stdout) of a child process."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    out, err = process.stdout.read(), process.stderr.read()
    process.returncode = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8
    if process.returncode:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(command[:4]), process.returncode, err[-2000:]))
    return wall, usage.ru_maxrss / 1024.0, out


def epoch_starts(python, package, module, first_chunk, directory, env):
    code = EPOCH_STARTS.format(module=module, first_chunk=first_chunk)
    return measured([python, "-c", code, package, directory], env)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10 ** 8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--baseline-records", type=int, default=10 ** 7,
                        help="records for the whole-epoch index (0: skip it)")
    parser.add_argument("--baseline-rev", default="319c05b", help="the git revision of the old lm/data.py")
    parser.add_argument("--directory", help="where the sparse datasets go (default: a temporary directory)")
    args = parser.parse_args(argv)

    python = sys.executable
    work = args.directory or tempfile.mkdtemp(prefix="data-index-")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "training_image")]),
               TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    results = {}
    try:
        big = os.path.join(work, "big")
        os.makedirs(big, exist_ok=True)
        started = time.perf_counter()
        manifest = sparse_dataset(big, args.records, args.seq_len)
        written = time.perf_counter() - started
        dry = [python, "-m", "lm.training.train", "--dry-run", "--strategy", "horovod", *presets.train_arguments("gpt-125m"),
               "--global_batch_size", "512", "--instance-type", "ml.p4d.24xlarge", "--instance-count", "8"]
        for name, command in (("import_only", dry), ("dry_run", dry + ["--data-dir", big])):
            wall, rss, out = measured(command, env)
            results[name] = {"wall_s": wall, "peak_rss_mib": rss, "records": args.records if name == "dry_run" else 0,
                             "output": out.strip()}
        wall, rss, _ = epoch_starts(python, os.path.join(ROOT, "training_image"), "lm.data.dataset", NEW_FIRST_CHUNK, big, env)
        results["epoch_starts"] = {"wall_s": wall, "peak_rss_mib": rss, "records": args.records}
        if args.baseline_records:
            small = os.path.join(work, "baseline")
            os.makedirs(small, exist_ok=True)
            sparse_dataset(small, args.baseline_records, args.seq_len)
            old = os.path.join(work, "old")
            os.makedirs(old, exist_ok=True)
            source = subprocess.run(["git", "-C", ROOT, "show", "%s:training_image/lm/data.py" % args.baseline_rev],
                                    capture_output=True, text=True, check=True).stdout
            # The old module's imports, at their current homes (the shard format moved to lm.spec).
            source = source.replace("from lm import shards", "from lm.spec import shards")
            with open(os.path.join(old, "whole_epoch_data.py"), "w") as handle:
                handle.write(source)
            wall, rss, _ = epoch_starts(python, old, "whole_epoch_data", OLD_FIRST_CHUNK, small, env)
            results["baseline_epoch_starts"] = {"wall_s": wall, "peak_rss_mib": rss, "records": args.baseline_records,
                                                "revision": args.baseline_rev}
            wall, rss, _ = epoch_starts(python, os.path.join(ROOT, "training_image"), "lm.data.dataset", NEW_FIRST_CHUNK, small, env)
            results["epoch_starts_at_baseline_size"] = {"wall_s": wall, "peak_rss_mib": rss,
                                                        "records": args.baseline_records}
    finally:
        if not args.directory:
            shutil.rmtree(work, ignore_errors=True)

    report = {"records": args.records, "seq_len": args.seq_len, "train_shards": len(manifest.split_shards("train")),
              "sparse_dataset_written_s": written, "results": results}
    print("%-30s %12s %10s %14s" % ("measurement", "records", "wall s", "peak RSS MiB"))
    for name, row in results.items():
        print("%-30s %12d %10.2f %14.0f" % (name, row["records"], row["wall_s"], row["peak_rss_mib"]))
    publish("data_index", report)
    return report


if __name__ == "__main__":
    main()
