"""A small deterministic Pile-format corpus built from text every Python installation has.

Documents: the prose of the Python documentation (`pydoc_data.topics`, labelled
"Pile-CC") and the standard library's `.py` sources (labelled "Github"), cut at line ends
into pieces of at most `PIECE_BYTES`, shuffled with a fixed seed. Each source gets an equal
share of `max_bytes` while it has text left (the prose is 465 kB in all), so a small corpus's
validation split (a hash of each document, `lm.data.prepare`) holds documents of both
sources: whole files put 99 % of the bytes into Github and no prose into a 600 kB corpus's
validation documents. The same Python installation always gives the same bytes; no downloads.

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
PIECE_BYTES = 4000
ZSTD_LEVEL = 3
_SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def _topic_texts():
    from pydoc_data.topics import topics
    for name in sorted(topics):
        yield topics[name]


def _source_texts():
    root = sysconfig.get_paths()["stdlib"]
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_DIRS)
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(directory, name), "rb") as handle:
                    yield handle.read().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue


SOURCES = {"Pile-CC": _topic_texts, "Github": _source_texts}


def pieces(text, limit=PIECE_BYTES):
    """`text` cut at line ends into pieces of at most `limit` UTF-8 bytes (a longer line is a piece of its own);
    blank pieces are dropped."""
    found, piece, size = [], [], 0
    for line in text.splitlines(keepends=True):
        length = len(line.encode("utf-8"))
        if piece and size + length > limit:
            found.append("".join(piece))
            piece, size = [], 0
        piece.append(line)
        size += length
    found.append("".join(piece))
    return [piece for piece in found if piece.strip()]


def sample_documents(max_bytes=DEFAULT_MAX_BYTES, seed=0):
    """Pile records whose texts add up to at most `max_bytes` UTF-8 bytes, in shuffled order: the next piece is
    always from the source with the fewest bytes so far (of those with pieces left)."""
    pools = {}
    for source, texts in SOURCES.items():
        pools[source] = [piece for text in texts() for piece in pieces(text)]
        random.Random(seed).shuffle(pools[source])
        pools[source].reverse()  # popped from the end: in shuffled order
    taken = dict.fromkeys(pools, 0)
    chosen = []
    while any(pools.values()):
        source = min((name for name in pools if pools[name]), key=lambda name: (taken[name], name))
        text = pools[source].pop()
        size = len(text.encode("utf-8"))
        if sum(taken.values()) + size > max_bytes:
            continue
        chosen.append({"text": text, "meta": {"pile_set_name": source}})
        taken[source] += size
    random.Random(seed).shuffle(chosen)
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
