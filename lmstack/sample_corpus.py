"""A small deterministic Pile-format corpus built from text every Python installation has.

Documents: the prose of the Python documentation (`pydoc_data.topics`, labelled
"Pile-CC") and the standard library's `.py` sources (labelled "Github"), shuffled with a
fixed seed and cut at `max_bytes` of text. The same Python installation always gives the
same bytes; no downloads.

    python -m lmstack.sample_corpus OUT [--max-bytes N] [--files N] [--seed N]

OUT ending in `.jsonl.zst` or `.jsonl` is one file; otherwise OUT is a directory that
receives `00.jsonl.zst`, `01.jsonl.zst`, ... (the Pile's naming), documents dealt round-robin.
"""
import argparse
import json
import os
import random
import sys
import sysconfig

import zstandard

DEFAULT_MAX_BYTES = 8 << 20
ZSTD_LEVEL = 3
_SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def _topic_documents():
    from pydoc_data.topics import topics
    for name in sorted(topics):
        yield {"text": topics[name], "meta": {"pile_set_name": "Pile-CC"}}


def _source_documents():
    root = sysconfig.get_paths()["stdlib"]
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_DIRS)
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(directory, name), "rb") as handle:
                    text = handle.read().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if text.strip():
                yield {"text": text, "meta": {"pile_set_name": "Github"}}


def sample_documents(max_bytes=DEFAULT_MAX_BYTES, seed=0):
    """Pile records whose texts add up to at most `max_bytes` UTF-8 bytes, in shuffled order."""
    documents = list(_topic_documents()) + list(_source_documents())
    random.Random(seed).shuffle(documents)
    chosen, total = [], 0
    for document in documents:
        size = len(document["text"].encode("utf-8"))
        if total + size > max_bytes:
            continue
        chosen.append(document)
        total += size
    return chosen


def encode_jsonl(documents):
    return b"".join(json.dumps(document).encode("utf-8") + b"\n" for document in documents)


def write_file(path, documents):
    """Write records as `.jsonl.zst` (or plain `.jsonl`) under a temporary name, then rename."""
    data = encode_jsonl(documents)
    if not path.endswith(".jsonl"):
        data = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
    return path


def write_sample_corpus(out, max_bytes=DEFAULT_MAX_BYTES, files=1, seed=0):
    """Write the sample corpus; returns the paths written."""
    if files < 1:
        raise ValueError("files must be at least 1, got %r" % files)
    documents = sample_documents(max_bytes, seed)
    if out.endswith(".jsonl") or out.endswith(".jsonl.zst"):
        if files != 1:
            raise ValueError("files=%d needs OUT to be a directory, got the file name %r" % (files, out))
        parent = os.path.dirname(out)
        if parent:
            os.makedirs(parent, exist_ok=True)
        return [write_file(out, documents)]
    os.makedirs(out, exist_ok=True)
    return [write_file(os.path.join(out, "%02d.jsonl.zst" % index), documents[index::files])
            for index in range(files)]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lmstack.sample_corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="a .jsonl.zst / .jsonl file, or a directory for --files N files")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="text bytes at most (default 8 MiB)")
    parser.add_argument("--files", type=int, default=1, help="number of files (OUT is then a directory)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed")
    args = parser.parse_args(argv)
    try:
        paths = write_sample_corpus(args.out, args.max_bytes, args.files, args.seed)
    except ValueError as error:
        parser.error(str(error))
    for path in paths:
        print("%s  %d bytes" % (path, os.path.getsize(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
