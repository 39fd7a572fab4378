"""Tokens per second `lm.data.dataset` delivers from shards on one CPU core, against two references.

    python bench/input_pipeline.py [--seq-len 2048] [--batch 8] [--mib 512] [--dp-size 1]

Writes a synthetic dataset (random uint16 tokens, `--mib` MiB in 64 MiB shards) to a temporary
directory, pins this process to one core, and reads it three ways in one run:

- `lm.data.dataset`: `TokenStream.dataset` for one epoch (shuffled blocks, this rank's slices),
  the int32 (inputs, labels) batches the train step receives;
- `fixed_length_records`: `tf.data.FixedLengthRecordDataset` over the shards in file order,
  batched and decoded the same way (sequential: no shuffling, no rank slicing);
- `numpy_sequential`: `np.fromfile` of every shard (the page cache's ceiling).

The shards are read once before timing, so all three read from the page cache. Target:
`lm.data.dataset` >= 20 M tokens/s. Prints a table and JSON; writes bench/results/input_pipeline.json.
"""
import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "training_image"))

from publish import publish  # noqa: E402

import numpy as np  # noqa: E402

from lm.spec import shards  # noqa: E402
from lm.compat import tf  # noqa: E402
from lm.data.dataset import TokenStream  # noqa: E402

SHARD_MIB = 64
TARGET_TOKENS_PER_S = 20e6


def write_dataset(directory, seq_len, mib):
    record_bytes = shards.record_bytes(seq_len, "uint16")
    per_shard = SHARD_MIB * (1 << 20) // record_bytes
    total = mib * (1 << 20) // record_bytes
    manifest = shards.Manifest(dtype="uint16", seq_len=seq_len, vocab_size=50257, eod_token_id=0,
                               tokenizer_file="tokenizer.json", tokenizer_sha256="")
    rng = np.random.RandomState(0)
    os.makedirs(os.path.join(directory, "train"))
    shards.write_atomically(os.path.join(directory, manifest.tokenizer_file), "{}")  # the start-up check wants one
    for index, start in enumerate(range(0, total, per_shard)):
        records = min(per_shard, total - start)
        tokens = rng.randint(0, 50257, size=(records, seq_len + 1)).astype("<u2")
        relative = "train/%05d.bin" % index
        path = os.path.join(directory, relative)
        tokens.tofile(path)
        manifest.shards.append(shards.Shard(path=relative, split="train", records=records, bytes=tokens.nbytes,
                                            sha256=shards.sha256_file(path)))
    shards.save_manifest(directory, manifest)
    return manifest


def timed(batches):
    started = time.perf_counter()
    tokens = 0
    for inputs, _ in batches:
        tokens += int(np.prod(inputs.shape))
    return tokens, time.perf_counter() - started


def fixed_length_records(directory, manifest, batch):
    files = [os.path.join(directory, shard.path) for shard in manifest.shards]
    width = manifest.seq_len + 1

    def decode(raw):
        tokens = tf.cast(tf.reshape(tf.io.decode_raw(raw, tf.uint16, little_endian=True), [-1, width]), tf.int32)
        return tokens[:, :-1], tokens[:, 1:]

    data = tf.data.FixedLengthRecordDataset(files, manifest.record_bytes).batch(batch, drop_remainder=True)
    return data.map(decode).prefetch(2)


def numpy_sequential(directory, manifest):
    for shard in manifest.shards:
        tokens = np.fromfile(os.path.join(directory, shard.path), "<u2").reshape(-1, manifest.seq_len + 1)
        yield tokens[:, :-1], None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8, help="sequences per batch on this rank")
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--dp-size", type=int, default=1, help="read rank 0's slices out of this many ranks")
    args = parser.parse_args(argv)

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)

    with tempfile.TemporaryDirectory() as directory:
        manifest = write_dataset(directory, args.seq_len, args.mib)
        list(numpy_sequential(directory, manifest))  # warm the page cache
        stream = TokenStream(directory, "train", global_batch_size=args.batch * args.dp_size,
                             dp_size=args.dp_size, seed=1)
        results = {}
        for name, batches in (("lm.data.dataset", lambda: stream.dataset(0)),
                              ("fixed_length_records", lambda: fixed_length_records(directory, manifest, args.batch)),
                              ("numpy_sequential", lambda: numpy_sequential(directory, manifest))):
            tokens, seconds = timed(batches())
            results[name] = {"tokens": tokens, "seconds": round(seconds, 4), "tokens_per_s": tokens / seconds}

    report = {"seq_len": args.seq_len, "batch": args.batch, "dp_size": args.dp_size, "mib": args.mib,
              "cores": 1, "target_tokens_per_s": TARGET_TOKENS_PER_S, "results": results,
              "meets_target": results["lm.data.dataset"]["tokens_per_s"] >= TARGET_TOKENS_PER_S}
    print("%-22s %14s %10s %16s" % ("reader", "tokens", "seconds", "M tokens/s"))
    for name, row in results.items():
        print("%-22s %14d %10.3f %16.1f" % (name, row["tokens"], row["seconds"], row["tokens_per_s"] / 1e6))
    publish("input_pipeline", report)


if __name__ == "__main__":
    main()
