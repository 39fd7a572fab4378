"""The on-disk token shard format: the one spec `lm.data.prepare` writes and `lm.data.dataset` reads.

A dataset directory holds `manifest.json`, the tokenizer file, and shards
`<split>/<name>.bin`: back-to-back records of `seq_len + 1` little-endian tokens
(`uint16` when the vocabulary fits, else `uint32`), no header, no padding. The validation split's
documents themselves are kept too, as JSON lines {"text", "meta": {"pile_set_name"}} in
`val_documents/<name>.jsonl` (one file per input, like its shards): the records pack documents
together, and bits per byte per source (`lm.eval.pile_bpb`) scores each document alone.
"""
import concurrent.futures
import dataclasses
import hashlib
import json
import os
from typing import Dict, List

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
DTYPES = {"uint16": 2, "uint32": 4}
SPLITS = ("train", "val")
VAL_DOCUMENTS_DIR = "val_documents"


class ShardError(ValueError):
    """A dataset that disagrees with its manifest or with the model; names the file."""


def dtype_for_vocab(vocab_size):
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def record_bytes(seq_len, dtype):
    return (seq_len + 1) * DTYPES[dtype]


def sha256_file(path, chunk=1 << 22):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclasses.dataclass
class Shard:
    path: str  # relative to the dataset directory
    split: str
    records: int
    bytes: int
    sha256: str


@dataclasses.dataclass
class Manifest:
    dtype: str
    seq_len: int
    vocab_size: int
    eod_token_id: int
    tokenizer_file: str
    tokenizer_sha256: str
    shards: List[Shard] = dataclasses.field(default_factory=list)
    # pile_set_name -> {"documents", "tokens", "text_bytes"}
    sources: Dict[str, Dict[str, int]] = dataclasses.field(default_factory=dict)
    # input file -> {"documents", "tokens", "text_bytes", "rejected": {kind: count}}
    inputs: Dict[str, dict] = dataclasses.field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    # how `lm.data.prepare` made it: records_per_shard, val_fraction, complete, part (see there)
    prepare: Dict[str, object] = dataclasses.field(default_factory=dict)
    # the validation documents: file (relative path) -> {"documents", "bytes", "sha256"}
    val_documents: Dict[str, Dict[str, object]] = dataclasses.field(default_factory=dict)
    # pile_set_name -> {"documents", "text_bytes"} of the validation documents
    val_sources: Dict[str, Dict[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def record_bytes(self):
        return record_bytes(self.seq_len, self.dtype)

    def split_shards(self, split):
        return [shard for shard in self.shards if shard.split == split]

    def records(self, split):
        return sum(shard.records for shard in self.split_shards(split))

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, values, source="manifest"):
        values = dict(values)
        version = values.get("format_version")
        if version != FORMAT_VERSION:
            raise ShardError("%s: format_version %r is not supported (expected %d)" % (source, version, FORMAT_VERSION))
        if values.get("dtype") not in DTYPES:
            raise ShardError("%s: dtype %r; allowed: %s" % (source, values.get("dtype"), ", ".join(DTYPES)))
        try:
            values["shards"] = [Shard(**shard) for shard in values.get("shards", [])]
            return cls(**values)
        except TypeError as error:
            raise ShardError("%s: %s" % (source, error))


def fingerprint(manifest):
    """sha256 of what decides the token stream: format, tokenizer and every shard's path, split,
    record count and sha256 (not the statistics, which a re-merge may rewrite)."""
    content = {name: getattr(manifest, name) for name in
               ("format_version", "dtype", "seq_len", "vocab_size", "eod_token_id", "tokenizer_sha256")}
    content["shards"] = [[shard.path, shard.split, shard.records, shard.sha256] for shard in manifest.shards]
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode("utf-8")).hexdigest()


def manifest_path(directory):
    return os.path.join(directory, MANIFEST_NAME)


def val_documents_name(key):
    return "%s/%s.jsonl" % (VAL_DOCUMENTS_DIR, key)


def val_documents_files(directory):
    """The validation documents files of a prepared dataset, as the manifest lists them."""
    return [os.path.join(directory, path) for path in sorted(load_manifest(directory).val_documents)]


def load_manifest(directory):
    path = manifest_path(directory)
    if not os.path.isfile(path):
        raise ShardError("%s: no dataset manifest (run `python -m lm.data.prepare` first)" % path)
    with open(path) as handle:
        try:
            values = json.load(handle)
        except ValueError as error:
            raise ShardError("%s: not valid JSON: %s" % (path, error))
    return Manifest.from_dict(values, source=path)


def write_atomically(path, data):
    """Write bytes or text under a temporary name, then rename: readers never see half a file."""
    tmp = "%s.tmp-%d" % (path, os.getpid())
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def save_manifest(directory, manifest):
    write_atomically(manifest_path(directory), manifest.to_json())


def check(directory, manifest, seq_len=None, vocab_size=None):
    """The start-up check: the manifest against the model, and every shard present with the size
    the manifest gives. It reads no shard data, so it costs O(shards), not O(dataset), at every
    (spot) restart of every host; `python -m lm.data.prepare verify` (`verify`) also hashes."""
    source = manifest_path(directory)
    if seq_len is not None and manifest.seq_len != seq_len:
        raise ShardError("%s: seq_len %d does not match the model's %d" % (source, manifest.seq_len, seq_len))
    if vocab_size is not None and manifest.vocab_size > vocab_size:
        raise ShardError("%s: vocab_size %d exceeds the model's %d" % (source, manifest.vocab_size, vocab_size))
    if not os.path.isfile(os.path.join(directory, manifest.tokenizer_file)):
        raise ShardError("%s: tokenizer %s is missing" % (source, manifest.tokenizer_file))
    for shard in manifest.shards:
        problem = size_problem(directory, manifest, shard)
        if problem:
            raise ShardError(problem)


def size_problem(directory, manifest, shard):
    """Why `shard` disagrees with the manifest by its presence or size, or None."""
    path = os.path.join(directory, shard.path)
    if not os.path.isfile(path):
        return "%s: listed in the manifest but missing" % path
    size = os.path.getsize(path)
    if size != shard.bytes or size != shard.records * manifest.record_bytes:
        return ("%s: %d bytes, manifest says %d records x %d bytes = %d"
                % (path, size, shard.records, manifest.record_bytes, shard.records * manifest.record_bytes))
    return None


def verify(directory, manifest, workers=4):
    """Every problem with the dataset: each shard's presence, size and sha256, and the
    tokenizer's sha256 (hashed on `workers` threads; hashlib releases the GIL). [] when sound."""
    files = [(os.path.join(directory, manifest.tokenizer_file), manifest.tokenizer_sha256, None)]
    files += [(os.path.join(directory, path), entry["sha256"], None) for path, entry in
              sorted(manifest.val_documents.items())]
    files += [(os.path.join(directory, shard.path), shard.sha256, shard) for shard in manifest.shards]

    def problem(item):
        path, expected, shard = item
        wrong_size = size_problem(directory, manifest, shard) if shard is not None else None
        if wrong_size:
            return wrong_size
        if not os.path.isfile(path):
            return "%s: missing" % path
        if sha256_file(path) != expected:
            return "%s: sha256 does not match the manifest" % path
        return None

    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        return [found for found in pool.map(problem, files) if found]
