"""Helpers for the data-preparation tests: read corpora, shard token streams and whole trees back."""
import json
import os

import numpy as np
import zstandard

from lm.spec import shards


def read_records(directory):
    records = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as handle:
            data = zstandard.ZstdDecompressor().decompressobj().decompress(handle.read())
        records[name] = [json.loads(line) for line in data.decode("utf-8").splitlines()]
    return records


def split_tokens(directory, key, split):
    """The token stream of one input's split: its shards in order, concatenated."""
    manifest = shards.load_manifest(directory)
    dtype = np.dtype(manifest.dtype).newbyteorder("<")
    prefix = "%s/%s-" % (split, key)
    paths = sorted(shard.path for shard in manifest.split_shards(split) if shard.path.startswith(prefix))
    return np.concatenate([np.fromfile(os.path.join(directory, path), dtype) for path in paths] or [np.zeros(0, dtype)])


def tree_bytes(directory):
    """{relative path: bytes} of every file under a directory."""
    found = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, directory)] = handle.read()
    return found
