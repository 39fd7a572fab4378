"""The Pile into compact token shards (the format of `lm.spec.shards`), fast, restartable, honest.

    python -m lm.data.prepare INPUT... --output DIR [--tokenizer FILE | --init-from HF_DIR] [options]
    python -m lm.data.prepare merge DIR          # one manifest from the parts of a multi-instance run
    python -m lm.data.prepare train-tokenizer INPUT... --output FILE [--vocab-size N]
    python -m lm.data.prepare verify DIR [--workers N]   # hash every shard against the manifest

Each input file is read by one worker process from start to end: documents tokenized,
an end-of-document token after each, the token stream of each split (a document goes to
"val" when a hash of its text falls under `val_fraction`) cut into records of
`seq_len + 1` tokens and written to that input's own shards `<split>/<key>-NNNNN.bin`.
The tokens after an input's last whole record (fewer than one record per split) are left
out and counted as `dropped_tokens`. Shards are written under a temporary name and
renamed when complete; `manifest.json` records every finished input, so a rerun of the
same command after a crash redoes only the unfinished inputs and ends with the same bytes.

With `--num-shards N` (N instances), instance i takes every N-th input file starting at i
and writes `manifest-part-IIIII-of-NNNNN.json`; the last instance to finish (or `merge`)
combines the parts into `manifest.json`. As a SageMaker training job (`prepare.py`) the
inputs come from the raw channel and i, N from SM_CURRENT_HOST / SM_HOSTS. The dataset
channel is the EFS file system's root (the one directory that exists on a fresh file system),
and the output is `--dataset-directory` inside it, made here. With `--raw-sharded` (an S3 raw
channel with ShardedByS3Key) SageMaker already gave each instance its own share of the files:
an instance then takes every file it sees, and the merge counts the parts' inputs together.
With an `init` channel (execution input init_from: a Hugging Face GPT-2 directory) the job
tokenizes with that checkpoint's tokenizer.json, as `--init-from` does, so that lm.training.train can
start from the checkpoint on this dataset. Given neither a tokenizer nor a checkpoint it trains a
byte-level BPE of `--vocab-size` on the first `--tokenizer-sample-bytes` of the input (as
`--train-tokenizer` asks explicitly): the image ships no tokenizer file and a job cannot count on
reaching the Hugging Face Hub, and a tokenizer learned from the corpus fits it.

Sizing the full Pile (825 GiB = 886 GB of text in 30 files) at r MB/s of text per vCPU: an
hour needs 886e3 / 3600 / r vCPUs, and 886e3 / 30 / 3600 = 8.2 MB/s per file, so about
8.2 / r tokenizer threads per worker (`--threads`; a worker's own Python work, about 4 % of
its time, does not run in parallel). With r = 1.8 (bench/prepare.py, byte-level BPE of 50257
tokens, on an idle 2-core development machine; 0.9 while it was shared) that is about 140 busy
vCPUs: 3 x ml.c5.18xlarge (72 vCPUs each), 10 workers x 5 threads each, about 9 MB/s per file,
a little under an hour. Measure r on the instance type first: one file with
`--workers 1 --threads 1`.
"""
import argparse
import collections
import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import threading
import time

import numpy as np

from lm.spec import contract
from lm.spec import job
from lm.data import pile
from lm.spec import shards
from lm import tokenizer as tokenizers_lib

TOKENIZER_FILE = "tokenizer.json"
PART_PATTERN = re.compile(r"^manifest-part-(\d+)-of-(\d+)\.json$")
# Settings that decide the bytes of the output: a rerun must match the existing output in all.
OUTPUT_SETTINGS = ("dtype", "seq_len", "vocab_size", "eod_token_id", "tokenizer_sha256")
PREPARE_SETTINGS = ("records_per_shard", "val_fraction")
BATCH_BYTES = 1 << 20  # text per encode_batch call, per tokenizer thread
PROGRESS_SECONDS = 0.5


class PrepareError(ValueError):
    """A run that cannot start: bad arguments, unreadable inputs, output made with other settings."""


def part_name(index, count):
    return "manifest-part-%05d-of-%05d.json" % (index, count)


def shard_name(split, key, index):
    return "%s/%s-%05d.bin" % (split, key, index)


def is_val(data, threshold):
    """The split of a document, from its content: exact duplicates land in the same split."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") < threshold


def val_threshold(val_fraction):
    return min(int(val_fraction * 2 ** 64), 2 ** 64)


# ---- one input file -> its shards (runs in a worker process) ----

class ShardWriter:
    """Whole records of one split of one input, into shards of `records_per_shard` records."""

    def __init__(self, directory, split, key, dtype, record_tokens, records_per_shard):
        self.directory, self.split, self.key = directory, split, key
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.record_tokens = record_tokens
        self.records_per_shard = records_per_shard
        self.carry = np.zeros(0, self.dtype)
        self.shards = []
        self._handle = None

    def _open(self):
        self._final = os.path.join(self.directory, shard_name(self.split, self.key, len(self.shards)))
        self._tmp = "%s.tmp-%d" % (self._final, os.getpid())
        self._handle = open(self._tmp, "wb")
        self._digest = hashlib.sha256()
        self._records = 0

    def _finish(self):
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        self._handle = None
        os.replace(self._tmp, self._final)
        size = self._records * self.record_tokens * self.dtype.itemsize
        self.shards.append(shards.Shard(
            path=os.path.relpath(self._final, self.directory).replace(os.sep, "/"),
            split=self.split, records=self._records, bytes=size, sha256=self._digest.hexdigest()))

    def add(self, tokens):
        tokens = np.concatenate([self.carry, tokens.astype(self.dtype, copy=False)])
        whole = len(tokens) // self.record_tokens
        start = 0
        while whole:
            if self._handle is None:
                self._open()
            take = min(whole, self.records_per_shard - self._records)
            end = start + take * self.record_tokens
            block = tokens[start:end].tobytes()
            self._handle.write(block)
            self._digest.update(block)
            self._records += take
            whole -= take
            start = end
            if self._records == self.records_per_shard:
                self._finish()
        self.carry = tokens[start:].copy()

    def close(self):
        """Finish the last shard; returns the number of tokens left over (less than one record)."""
        if self._handle is not None:
            self._finish()
        return len(self.carry)


class ValDocumentsWriter:
    """The validation documents of one input as JSON lines {"text", "meta": {"pile_set_name"}}, under
    a temporary name until `close` renames the complete file (`lm.spec.shards.val_documents_name`)."""

    def __init__(self, directory, key):
        self.path = shards.val_documents_name(key)
        self._final = os.path.join(directory, self.path)
        self._tmp = "%s.tmp-%d" % (self._final, os.getpid())
        self._handle = open(self._tmp, "wb")
        self._digest = hashlib.sha256()
        self.documents = self.bytes = 0

    def add(self, text, source):
        line = (json.dumps({"text": text, "meta": {"pile_set_name": source}}, ensure_ascii=False) + "\n").encode()
        self._handle.write(line)
        self._digest.update(line)
        self.documents += 1
        self.bytes += len(line)

    def close(self):
        """Rename the finished file into place; returns its manifest entry."""
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self._tmp, self._final)
        return {"path": self.path, "documents": self.documents, "bytes": self.bytes, "sha256": self._digest.hexdigest()}


_worker = {}  # per process: the tokenizer, the progress queue, the parent's pid


def _init_worker(tokenizer, threads, queue=None, parent_pid=None):
    """`tokenizer`: the loaded one (in this process) or its file (in a worker process)."""
    # Before the tokenizer's thread pool first starts (it reads RAYON_NUM_THREADS once).
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    if isinstance(tokenizer, str):
        tokenizer = tokenizers_lib.Tokenizer.from_file(tokenizer)
    _worker["tokenizer"] = tokenizer
    _worker["queue"] = queue
    _worker["parent_pid"] = parent_pid
    if parent_pid is not None:
        # An idle pool worker waits for its next task and never reaches `_report`: watch for the
        # run being killed from a thread, so no worker outlives it.
        threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()


def _exit_when_orphaned(parent_pid, interval=0.5):
    while os.getppid() == parent_pid:
        time.sleep(interval)
    os._exit(3)


def _report(progress, update):
    if progress is not None:
        progress(update)
        return
    if _worker["parent_pid"] is not None and os.getppid() != _worker["parent_pid"]:
        os._exit(3)  # the run was killed: stop before writing more under its names
    _worker["queue"].put(update)


def _encode(tokenizer, texts):
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # _fast: tokenizers >= 0.20
    return encode(texts, add_special_tokens=False)


def process_input(task, progress=None):
    """Tokenize one input file into its shards; returns its manifest entry (with `shards`)."""
    tokenizer = _worker["tokenizer"]
    eod, threshold = task["eod_token_id"], task["val_threshold"]
    writers = {split: ShardWriter(task["output"], split, task["key"], task["dtype"], task["seq_len"] + 1,
                                  task["records_per_shard"]) for split in shards.SPLITS}
    val_documents = ValDocumentsWriter(task["output"], task["key"])
    reader = pile.Reader(task["path"])
    sources = collections.defaultdict(collections.Counter)
    val_sources = collections.defaultdict(collections.Counter)
    totals = collections.Counter()
    batch_bytes = BATCH_BYTES * task["threads"]
    reported = collections.Counter({"position": 0})
    last_report = time.time()

    def flush(batch):
        nonlocal last_report
        streams = {split: [] for split in shards.SPLITS}
        text_bytes = tokens = 0
        for (text, data, source, split), encoding in zip(batch, _encode(tokenizer, [doc[0] for doc in batch])):
            ids = encoding.ids
            if split == "val":
                val_documents.add(text, source)
                val_sources[source].update(documents=1, text_bytes=len(data))
            streams[split].extend(ids)
            streams[split].append(eod)
            counts = sources[source]
            counts["documents"] += 1
            counts["tokens"] += len(ids) + 1
            counts["text_bytes"] += len(data)
            text_bytes += len(data)
            tokens += len(ids) + 1
        for split, stream in streams.items():
            if stream:
                writers[split].add(np.array(stream, dtype=writers[split].dtype))
        totals.update(documents=len(batch), tokens=tokens, text_bytes=text_bytes)
        if time.time() - last_report >= PROGRESS_SECONDS:
            update = {"input_bytes": reader.position - reported["position"],
                      "text_bytes": totals["text_bytes"] - reported["text_bytes"],
                      "tokens": totals["tokens"] - reported["tokens"]}
            reported.update(update)
            reported["position"] = reader.position
            _report(progress, update)
            last_report = time.time()

    batch, size = [], 0
    for text, data, source in reader.documents():
        batch.append((text, data, source, "val" if is_val(data, threshold) else "train"))
        size += len(data)
        if size >= batch_bytes:
            flush(batch)
            batch, size = [], 0
    if batch:
        flush(batch)
    dropped = sum(writer.close() for writer in writers.values())
    val_entry = val_documents.close()
    _report(progress, {"input_bytes": task["size"] - reported["position"],
                       "text_bytes": totals["text_bytes"] - reported["text_bytes"],
                       "tokens": totals["tokens"] - reported["tokens"]})
    written = [shard for split in shards.SPLITS for shard in writers[split].shards]
    return {
        "file": task["name"],
        "input_bytes": task["size"],
        "documents": totals["documents"],
        "tokens": totals["tokens"],
        "text_bytes": totals["text_bytes"],
        "dropped_tokens": dropped,
        "rejected": {kind: reader.rejected[kind] for kind in pile.REJECT_KINDS},
        "sources": {name: dict(counts) for name, counts in sorted(sources.items())},
        "shards": [dataclasses.asdict(shard) for shard in written],
        "val_documents": dict(val_entry, sources={name: dict(counts) for name, counts in sorted(val_sources.items())}),
    }


# ---- the run: checks first, then the inputs that are not finished ----

def cpu_count():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def resolve_shard(shard_index, num_shards):
    """This instance's (index, count): given, or from the SageMaker cluster (SM_HOSTS)."""
    hosts = json.loads(os.environ.get("SM_HOSTS", "[]"))
    if num_shards == 0:
        num_shards = max(1, len(hosts))
    if shard_index < 0:
        host = os.environ.get("SM_CURRENT_HOST")
        shard_index = hosts.index(host) if host in hosts and len(hosts) == num_shards else 0
    if shard_index >= num_shards:
        raise PrepareError("shard_index %d must be below num_shards %d" % (shard_index, num_shards))
    return shard_index, num_shards


def _read_manifest(path):
    with open(path) as handle:
        try:
            return shards.Manifest.from_dict(json.load(handle), source=path)
        except ValueError as error:
            raise PrepareError("%s: not a manifest: %s" % (path, error))


def _check_same(existing, wanted, source):
    for name, value in wanted.items():
        if existing.get(name) != value:
            raise PrepareError(
                "%s was made with %s=%r; this run asks for %s=%r: use a new --output or the same settings"
                % (source, name, existing.get(name), name, value))


def _sample_texts(inputs, sample_bytes):
    """The first documents of every input, `sample_bytes` of text in all, shared evenly."""
    share = max(1, sample_bytes // len(inputs))
    for item in inputs:
        taken = 0
        for text, data, _ in pile.Reader(item.path).documents():
            yield text
            taken += len(data)
            if taken >= share:
                break


def train_tokenizer(inputs, path, vocab_size, sample_bytes, eod_token):
    tokenizer = tokenizers_lib.train_bpe(_sample_texts(inputs, sample_bytes), vocab_size, eod_token)
    tokenizers_lib.save(tokenizer, path)
    return tokenizer


def _resolve_tokenizer_path(name, input_paths):
    if os.path.isabs(name) or os.path.exists(name):
        return name
    for root in input_paths:
        candidate = os.path.join(root if os.path.isdir(root) else os.path.dirname(root), name)
        if os.path.exists(candidate):
            return candidate
    return name


def _load_tokenizer(args, inputs, output, existing):
    """The tokenizer file in the output (copied or trained there) and the output settings it implies."""
    target = os.path.join(output, TOKENIZER_FILE)
    if args.tokenizer and args.train_tokenizer:
        raise PrepareError("--tokenizer and --train-tokenizer exclude each other; pass one")
    if args.tokenizer:
        if args.raw_sharded and args.num_shards > 1 and not os.path.isabs(args.tokenizer):
            raise PrepareError("tokenizer %r: with a sharded S3 raw channel each instance sees only its own files, "
                               "so a tokenizer among them reaches one instance; put it on the EFS file system and "
                               "pass its path from the root (e.g. /tokenizers/gpt2.json)" % args.tokenizer)
        source = _resolve_tokenizer_path(args.tokenizer, args.inputs)
        tokenizer, eod = tokenizers_lib.load(source, args.eod_token)
        digest = shards.sha256_file(source)
        if existing is not None and existing.tokenizer_sha256 != digest:
            raise PrepareError("%s was made with another tokenizer (sha256 %s); %s has sha256 %s"
                               % (output, existing.tokenizer_sha256, source, digest))
        copy = not os.path.exists(target) or shards.sha256_file(target) != digest
        return tokenizer, eod, digest, (lambda: _copy_atomically(source, target)) if copy else None
    if existing is not None and os.path.exists(target):
        tokenizer, eod = tokenizers_lib.load(target, args.eod_token)
        if existing.prepare.get("trained_vocab_size") != args.vocab_size:
            raise PrepareError("%s has a tokenizer trained for vocab_size=%r; this run asks for vocab_size=%r"
                               % (output, existing.prepare.get("trained_vocab_size"), args.vocab_size))
        return tokenizer, eod, shards.sha256_file(target), None
    if args.num_shards > 1:
        raise PrepareError("training the tokenizer (no --tokenizer, no --init-from) with %d instances would train %d "
                           "tokenizers: run `python -m lm.data.prepare train-tokenizer` once and pass --tokenizer"
                           % (args.num_shards, args.num_shards))
    print("training a byte-level BPE tokenizer (vocab %d) on %d MB of the input"
          % (args.vocab_size, args.tokenizer_sample_bytes // 10 ** 6), flush=True)
    train_tokenizer(inputs, target, args.vocab_size, args.tokenizer_sample_bytes, args.eod_token)
    tokenizer, eod = tokenizers_lib.load(target, args.eod_token)  # the file, as a rerun will see it
    return tokenizer, eod, shards.sha256_file(target), None


def _copy_atomically(source, target):
    # Several instances may copy into one EFS directory, and containers repeat pids.
    tmp = "%s.tmp-%s-%d" % (target, socket.gethostname(), os.getpid())
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _manifest_file(output, index, count):
    return os.path.join(output, shards.MANIFEST_NAME if count == 1 else part_name(index, count))


def _aggregate(manifest):
    """Shards (sorted by path), validation documents and per-source totals, from the finished inputs."""
    sources = collections.defaultdict(collections.Counter)
    val_sources = collections.defaultdict(collections.Counter)
    listed, val_documents = [], {}
    for entry in manifest.inputs.values():
        for name, counts in entry["sources"].items():
            sources[name].update(counts)
        listed.extend(shards.Shard(**shard) for shard in entry["shards"])
        documents = entry["val_documents"]
        val_documents[documents["path"]] = {name: documents[name] for name in ("documents", "bytes", "sha256")}
        for name, counts in documents["sources"].items():
            val_sources[name].update(counts)
    manifest.shards = sorted(listed, key=lambda shard: shard.path)
    manifest.sources = {name: dict(counts) for name, counts in sorted(sources.items())}
    manifest.val_documents = dict(sorted(val_documents.items()))
    manifest.val_sources = {name: dict(counts) for name, counts in sorted(val_sources.items())}


def _stale_files(output, key):
    pattern = re.compile(r"^%s(-\d{5}\.bin|\.jsonl)(\.tmp-\d+)?$" % re.escape(key))
    for directory in shards.SPLITS + (shards.VAL_DOCUMENTS_DIR,):
        directory = os.path.join(output, directory)
        for name in sorted(os.listdir(directory)):
            if pattern.match(name):
                yield os.path.join(directory, name)


def _finished(manifest, output, item):
    """Whether the manifest lists this input as done and its shards and validation documents are all there."""
    entry = manifest.inputs.get(item.key)
    if entry is None:
        return False
    if entry["input_bytes"] != item.size:
        raise PrepareError("%s: %d bytes now, %d when it was prepared into %s; the input changed: use a new --output"
                           % (item.path, item.size, entry["input_bytes"], output))
    if "val_documents" not in entry:  # prepared before the validation documents were kept: redo it
        return False
    return all(os.path.isfile(os.path.join(output, item["path"])) and
               os.path.getsize(os.path.join(output, item["path"])) == item["bytes"]
               for item in entry["shards"] + [entry["val_documents"]])


def prepare(args):
    """Run `lm.data.prepare` on parsed arguments; returns the manifest."""
    started = time.time()
    if not args.inputs:
        raise PrepareError("no inputs: pass INPUT paths (or run as a SageMaker job with a %r channel)"
                           % job.PREPARE_INPUT_CHANNEL)
    if not args.output:
        raise PrepareError("no --output directory (or run as a SageMaker job with a %r channel)"
                           % job.PREPARE_OUTPUT_CHANNEL)
    all_inputs = pile.find_inputs(args.inputs)
    index, count = resolve_shard(args.shard_index, args.num_shards)
    args.num_shards = count
    inputs = all_inputs if args.raw_sharded else all_inputs[index::count]
    output = args.output
    for directory in shards.SPLITS + (shards.VAL_DOCUMENTS_DIR,):
        os.makedirs(os.path.join(output, directory), exist_ok=True)
    if not os.access(output, os.W_OK):
        raise PrepareError("%s: output directory is not writable" % output)
    manifest_file = _manifest_file(output, index, count)
    existing = _read_manifest(manifest_file) if os.path.exists(manifest_file) else None

    tokenizer, eod, digest, copy_tokenizer = _load_tokenizer(args, inputs or all_inputs, output, existing)
    vocab_size = tokenizer.get_vocab_size()
    dtype = shards.dtype_for_vocab(vocab_size)
    record_bytes = shards.record_bytes(args.seq_len, dtype)
    settings = {"dtype": dtype, "seq_len": args.seq_len, "vocab_size": vocab_size, "eod_token_id": eod,
                "tokenizer_sha256": digest}
    prepare_settings = {"records_per_shard": max(1, args.shard_size // record_bytes),
                        "val_fraction": args.val_fraction}
    if existing is not None:
        _check_same({name: getattr(existing, name) for name in OUTPUT_SETTINGS}, settings, manifest_file)
        _check_same(existing.prepare, prepare_settings, manifest_file)
    if copy_tokenizer is not None:
        copy_tokenizer()

    manifest = existing or shards.Manifest(tokenizer_file=TOKENIZER_FILE, **settings)
    manifest.prepare = dict(prepare_settings, complete=False)
    if not args.tokenizer:  # trained here
        manifest.prepare["trained_vocab_size"] = args.vocab_size
    if count > 1:
        manifest.prepare["part"] = {"index": index, "count": count, "inputs": len(all_inputs),
                                    "sharded": bool(args.raw_sharded)}
    todo = [item for item in inputs if not _finished(manifest, output, item)]
    for item in todo:
        manifest.inputs.pop(item.key, None)
        for path in _stale_files(output, item.key):
            os.remove(path)
    directory, name = os.path.split(manifest_file)
    for leftover in os.listdir(directory):
        if leftover.startswith(name + ".tmp-"):
            os.remove(os.path.join(directory, leftover))
    _aggregate(manifest)
    shards.write_atomically(manifest_file, manifest.to_json())
    if len(todo) < len(inputs):
        print("resuming: %d of %d inputs already done" % (len(inputs) - len(todo), len(inputs)), flush=True)

    workers = min(args.workers or cpu_count(), max(1, len(todo)))
    threads = args.threads or max(1, cpu_count() // workers)
    tasks = [{"path": item.path, "name": item.name, "key": item.key, "size": item.size, "output": output,
              "dtype": dtype, "seq_len": args.seq_len, "eod_token_id": eod, "threads": threads,
              "records_per_shard": prepare_settings["records_per_shard"],
              "val_threshold": val_threshold(args.val_fraction)} for item in todo]
    run = Progress(sum(item.size for item in todo))
    tokenizer_path = os.path.join(output, TOKENIZER_FILE)
    try:
        for key, entry in _run_tasks(tasks, workers, threads, tokenizer if workers <= 1 else tokenizer_path, run):
            manifest.inputs[key] = entry
            _aggregate(manifest)
            shards.write_atomically(manifest_file, manifest.to_json())
    finally:
        run.close()
    manifest.prepare["complete"] = True
    shards.write_atomically(manifest_file, manifest.to_json())
    print(summary_table(manifest))
    elapsed = max(time.time() - run.started, 1e-9)
    print("this run: %d inputs, %.1f MB of text in %.1f s (%.2f MB/s, %.0f tokens/s) with %d workers x %d threads;"
          " %.1f s in all" % (len(todo), run.text_bytes / 1e6, elapsed, run.text_bytes / 1e6 / elapsed,
                              run.tokens / elapsed, workers, threads, time.time() - started), flush=True)
    if count > 1:
        missing = _missing_parts(output, count)
        if not missing:
            merge(output)
        else:
            print("part %d of %d done; waiting for parts %s (then `python -m lm.data.prepare merge %s`)"
                  % (index, count, ", ".join(map(str, missing)), output))
    return manifest


def _run_tasks(tasks, workers, threads, tokenizer, run):
    """Yield (key, manifest entry) per finished input, in the order they finish."""
    if workers <= 1:
        _init_worker(tokenizer, threads)
        for task in tasks:
            yield task["key"], process_input(task, progress=run.update)
        return
    import concurrent.futures
    import multiprocessing
    import queue as queue_lib
    context = multiprocessing.get_context("spawn")  # no fork after the tokenizer's threads ran
    updates = context.Queue()
    with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=context, initializer=_init_worker,
            initargs=(tokenizer, threads, updates, os.getpid())) as pool:
        pending = {pool.submit(process_input, task): task for task in tasks}
        failed = []
        while pending:
            done, _ = concurrent.futures.wait(pending, timeout=PROGRESS_SECONDS,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            while True:
                try:
                    run.update(updates.get_nowait())
                except queue_lib.Empty:
                    break
            for future in done:
                task = pending.pop(future)
                try:
                    entry = future.result()
                except Exception as error:  # the other inputs still finish and are recorded
                    failed.append("%s: %s: %s" % (task["path"], type(error).__name__, error))
                    continue
                yield task["key"], entry
    if failed:
        raise PrepareError("%d inputs failed (the others are recorded; rerun to retry):\n  %s"
                           % (len(failed), "\n  ".join(failed)))


class Progress:
    """A tqdm bar over input file bytes, with text MB/s and tokens/s."""

    def __init__(self, total):
        from tqdm import tqdm
        interactive = sys.stderr.isatty()
        self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="prepare", mininterval=0.5 if interactive else 60,
                        file=sys.stderr)
        self.started = time.time()
        self.text_bytes = self.tokens = 0

    def update(self, update):
        self.text_bytes += update["text_bytes"]
        self.tokens += update["tokens"]
        elapsed = max(time.time() - self.started, 1e-9)
        self.bar.set_postfix_str("text %.2f MB/s, %.0f tokens/s" % (self.text_bytes / 1e6 / elapsed,
                                                                     self.tokens / elapsed), refresh=False)
        self.bar.update(update["input_bytes"])

    def close(self):
        self.bar.close()


def summary_table(manifest):
    """Documents, tokens, bytes in and out, ratio and rejected records, per input and in total."""
    header = ("input", "documents", "tokens", "file MB", "text MB", "shard MB", "ratio", "rejected")
    rows, total, rejected_total = [], collections.Counter(), collections.Counter()
    for key in sorted(manifest.inputs):
        entry = manifest.inputs[key]
        out = sum(shard["bytes"] for shard in entry["shards"])
        total.update(documents=entry["documents"], tokens=entry["tokens"], file=entry["input_bytes"],
                     text=entry["text_bytes"], out=out)
        rejected_total.update(entry["rejected"])
        rows.append(_row(entry["file"], entry["documents"], entry["tokens"], entry["input_bytes"], entry["text_bytes"],
                         out, entry["rejected"]))
    rows.append(_row("total", total["documents"], total["tokens"], total["file"], total["text"], total["out"],
                     rejected_total))
    widths = [max(len(row[column]) for row in [header] + rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if column in (0, 7) else cell.rjust(width)
                       for column, (cell, width) in enumerate(zip(row, widths))) for row in [header] + rows]
    records = "records: %s" % ", ".join("%s %d" % (split, manifest.records(split)) for split in shards.SPLITS)
    return "\n".join(lines[:1] + ["-" * len(lines[0])] + lines[1:] + [records])


def _row(name, documents, tokens, file_bytes, text_bytes, out_bytes, rejected):
    kinds = ", ".join("%s=%d" % (kind, rejected[kind]) for kind in pile.REJECT_KINDS if rejected.get(kind))
    return (name, str(documents), str(tokens), "%.2f" % (file_bytes / 1e6), "%.2f" % (text_bytes / 1e6),
            "%.2f" % (out_bytes / 1e6),
            "%.3f" % (out_bytes / text_bytes) if text_bytes else "-", kinds or "none")


# ---- merge: the parts of a multi-instance run into one manifest ----

def _parts(directory):
    found = {}
    for name in sorted(os.listdir(directory)):
        match = PART_PATTERN.match(name)
        if match:
            found.setdefault(int(match.group(2)), {})[int(match.group(1))] = os.path.join(directory, name)
    return found


def _missing_parts(directory, count):
    present = _parts(directory).get(count, {})
    return [index for index in range(count)
            if index not in present or not _read_manifest(present[index]).prepare.get("complete")]


def merge(directory):
    """Combine `manifest-part-*` files into `manifest.json`; every part must be there and complete."""
    found = _parts(directory)
    if len(found) != 1:
        raise PrepareError("%s: expected the parts of one run (manifest-part-I-of-N.json), found counts %s"
                           % (directory, sorted(found) or "none"))
    count = next(iter(found))
    missing = _missing_parts(directory, count)
    if missing:
        raise PrepareError("%s: parts %s of %d are missing or unfinished; run those instances first"
                           % (directory, ", ".join(map(str, missing)), count))
    parts = [_read_manifest(found[count][index]) for index in range(count)]
    first = parts[0]
    merged = shards.Manifest(tokenizer_file=first.tokenizer_file,
                             **{name: getattr(first, name) for name in OUTPUT_SETTINGS})
    merged.prepare = {name: first.prepare[name] for name in PREPARE_SETTINGS}
    if first.prepare.get("part", {}).get("sharded"):  # each part saw only its own files
        expected = sum(part.prepare.get("part", {}).get("inputs", 0) for part in parts)
    else:
        expected = first.prepare.get("part", {}).get("inputs")
    for index, part in enumerate(parts):
        source = found[count][index]
        _check_same({name: getattr(part, name) for name in OUTPUT_SETTINGS},
                    {name: getattr(first, name) for name in OUTPUT_SETTINGS}, source)
        _check_same(part.prepare, merged.prepare, source)
        for key, entry in part.inputs.items():
            if key in merged.inputs:
                raise PrepareError("%s: input %r is also in another part" % (source, key))
            merged.inputs[key] = entry
    if len(merged.inputs) != expected:
        raise PrepareError("%s: the parts hold %d inputs; the run had %r" % (directory, len(merged.inputs), expected))
    merged.prepare["complete"] = True
    _aggregate(merged)
    shards.save_manifest(directory, merged)
    print("merged %d parts: %d inputs, %d shards into %s" % (count, len(merged.inputs), len(merged.shards),
                                                            shards.manifest_path(directory)))
    return merged


# ---- command line (the toolkit passes hyperparameters as `--name value`) ----

_SIZE_SUFFIXES = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12,
                  "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_int(text):
    """An integer, optionally with a size suffix: 1GiB, 512MiB, 100M (a sign too: the job's default
    shard_index is -1)."""
    match = re.match(r"^\s*(-?\d+)\s*([A-Za-z]*)\s*$", str(text))
    if not match or (match.group(2) and match.group(2).lower() not in _SIZE_SUFFIXES):
        raise argparse.ArgumentTypeError("%r is not an integer (size suffixes: %s)" % (text, ", ".join(_SIZE_SUFFIXES)))
    return int(match.group(1)) * _SIZE_SUFFIXES.get(match.group(2).lower(), 1)


def parse_bool(text):
    value = str(text).strip().lower()
    if value not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError("%r is not true or false" % text)
    return value in ("true", "1")


def _float(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m lm.data.prepare", description=__doc__.split("\n\n")[0],
        epilog="Also: `python -m lm.data.prepare merge DIR`, `python -m lm.data.prepare train-tokenizer INPUT... --output FILE`, "
               "`python -m lm.data.prepare verify DIR`.")
    parser.add_argument("inputs", nargs="*", help=".jsonl.zst / .jsonl files or directories (default: $SM_CHANNEL_%s)"
                        % job.PREPARE_INPUT_CHANNEL.upper())
    parser.add_argument("--output", help="dataset directory (default: --dataset-directory inside $SM_CHANNEL_%s)"
                        % job.PREPARE_OUTPUT_CHANNEL.upper())
    # Set by the request builder (controlplane.request.prepare_arguments), not by users of the job.
    parser.add_argument("--" + contract.PREPARE_DATASET_DIRECTORY, "--dataset-directory",
                        dest=contract.PREPARE_DATASET_DIRECTORY, default="",
                        help="the dataset directory as a path from the file system's root; made inside the "
                             "dataset channel (the root, mounted read-write)")
    parser.add_argument("--" + contract.PREPARE_RAW_SHARDED, "--raw-sharded", dest=contract.PREPARE_RAW_SHARDED,
                        type=parse_bool, nargs="?", const=True, default=False,
                        help="the raw channel holds only this instance's files (S3 ShardedByS3Key)")
    parser.add_argument("--init-from", default=os.environ.get(contract.channel_environment_variable(
                        contract.INIT_CHANNEL)), help="a Hugging Face GPT-2 directory (lm.training.train --init-from): tokenize "
                        "with its tokenizer.json, its config.json's eos_token_id as the end-of-document token "
                        "[env %s]" % contract.channel_environment_variable(contract.INIT_CHANNEL))
    types = {int: parse_int, float: _float, str: str}
    for name, spec in job.PREPARE_HYPERPARAMETERS.items():
        flags = ["--" + name.replace("_", "-")] + (["--" + name] if "_" in name else [])
        if spec.type is bool:  # a flag by hand; `--name true|false` as the toolkit writes it
            parser.add_argument(flags[0], dest=name, action="store_true", default=spec.default, help=spec.help)
            parser.add_argument("--" + name, dest=name, type=parse_bool, default=spec.default, help=argparse.SUPPRESS)
        else:
            parser.add_argument(*flags, dest=name, type=types[spec.type], default=spec.default,
                                help="%s (default %s)" % (spec.help, spec.default))
    return parser


def parse_args(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    values = {name: getattr(args, name) for name in job.PREPARE_HYPERPARAMETERS}
    try:
        job.validate_hyperparameters(values, job.PREPARE_HYPERPARAMETERS)
    except ValueError as error:
        parser.error(str(error))
    if not args.inputs and os.environ.get("SM_CHANNEL_%s" % job.PREPARE_INPUT_CHANNEL.upper()):
        args.inputs = [os.environ["SM_CHANNEL_%s" % job.PREPARE_INPUT_CHANNEL.upper()]]
    root = os.environ.get("SM_CHANNEL_%s" % job.PREPARE_OUTPUT_CHANNEL.upper())
    if not args.output:
        args.output = output_directory(root, args.dataset_directory)
    if root and os.path.isabs(args.tokenizer) and not os.path.exists(args.tokenizer):
        args.tokenizer = output_directory(root, args.tokenizer)  # a path from the file system's root
    if args.init_from:
        use_checkpoint_tokenizer(args)
    return args


def use_checkpoint_tokenizer(args):
    """--init-from: the checkpoint's tokenizer becomes `--tokenizer` and its eos token `--eod-token`,
    which then take the one path of a given tokenizer file."""
    from lm import hf

    source = "--init-from %s (or the %r channel)" % (args.init_from, contract.INIT_CHANNEL)
    if args.train_tokenizer:
        raise PrepareError("%s brings the checkpoint's tokenizer; --train-tokenizer would train another: leave it out"
                           % source)
    if args.tokenizer:
        raise PrepareError("%s brings the checkpoint's tokenizer; --tokenizer %s would tokenize with another: "
                           "leave it out" % (source, args.tokenizer))
    try:
        tokenizer_file, eod_token = hf.dataset_tokenizer(args.init_from, args.eod_token)
    except hf.HFError as error:
        raise PrepareError(str(error))
    if args.eod_token not in (job.PREPARE_HYPERPARAMETERS["eod_token"].default, eod_token):
        raise PrepareError("--eod-token %r: the checkpoint's end-of-document token (config.json eos_token_id) is %r; "
                           "leave --eod-token out" % (args.eod_token, eod_token))
    args.tokenizer, args.eod_token = os.path.abspath(tokenizer_file), eod_token


def output_directory(channel, dataset_directory):
    """Where a prepare job writes: `dataset_directory` (a path from the file system's root) inside the
    dataset channel, which mounts that root; None without a channel."""
    if not channel:
        return None
    parts = [part for part in dataset_directory.split("/") if part]
    if ".." in parts:
        raise PrepareError("dataset_directory %r must not contain '..'" % dataset_directory)
    return os.path.join(channel, *parts)


def _train_tokenizer_main(argv):
    parser = argparse.ArgumentParser(prog="python -m lm.data.prepare train-tokenizer",
                                     description="Train the byte-level BPE a multi-instance run then shares.")
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--output", required=True, help="tokenizer JSON file to write")
    for name in ("vocab_size", "tokenizer_sample_bytes", "eod_token"):
        spec = job.PREPARE_HYPERPARAMETERS[name]
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=spec.default,
                            type=parse_int if spec.type is int else str, help=spec.help)
    args = parser.parse_args(argv)
    tokenizer = train_tokenizer(pile.find_inputs(args.inputs), args.output, args.vocab_size,
                                args.tokenizer_sample_bytes, args.eod_token)
    print("%s: vocab %d" % (args.output, tokenizer.get_vocab_size()))


# `verify` exits 0 when the dataset is sound, 1 when it has problems (each printed), and 2, the
# status of every lm.data.prepare error, when there is no readable manifest.
VERIFY_OK, VERIFY_PROBLEMS = 0, 1


def _verify_main(argv):
    """Hash every shard and the tokenizer against the manifest; training itself checks only sizes."""
    parser = argparse.ArgumentParser(prog="python -m lm.data.prepare verify", description=_verify_main.__doc__)
    parser.add_argument("directory", help="dataset directory (with manifest.json)")
    parser.add_argument("--workers", type=int, default=4, help="files hashed in parallel (default 4)")
    args = parser.parse_args(argv)
    manifest = shards.load_manifest(args.directory)
    started = time.time()
    problems = shards.verify(args.directory, manifest, workers=args.workers)
    for problem in problems:
        print("lm.data.prepare verify: %s" % problem, file=sys.stderr)
    total = sum(shard.bytes for shard in manifest.shards)
    print("%s: %d shards, %d bytes, %s (%.1f s)" % (
        args.directory, len(manifest.shards), total,
        "%d problem(s)" % len(problems) if problems else "every sha256 matches the manifest", time.time() - started))
    return VERIFY_PROBLEMS if problems else VERIFY_OK


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["verify"]:
            return _verify_main(argv[1:])
        if argv[:1] == ["merge"]:
            if len(argv) != 2:
                raise PrepareError("usage: python -m lm.data.prepare merge DIR")
            merge(argv[1])
        elif argv[:1] == ["train-tokenizer"]:
            _train_tokenizer_main(argv[1:])
        else:
            prepare(parse_args(argv))
    except (PrepareError, pile.InputError, tokenizers_lib.TokenizerError, shards.ShardError) as error:
        print("lm.data.prepare: error: %s" % error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
