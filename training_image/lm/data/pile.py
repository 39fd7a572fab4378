"""Reading Pile-format files, streaming, with every rejected record counted by kind.

A Pile file is JSON lines `{"text": ..., "meta": {"pile_set_name": ...}}`, plain
(`.jsonl`) or zstandard-compressed (`.jsonl.zst`). Decompression runs chunk by chunk, so
memory stays at one chunk plus the longest line, whatever the file size.
"""
import collections
import json
import os
import re

import zstandard

INPUT_SUFFIXES = (".jsonl.zst", ".jsonl.zstd", ".jsonl")
# Why a record was left out. "truncated" counts a compressed stream that ends inside a
# frame or stops decoding (0 or 1 per file); the partial line at that point is part of it.
REJECT_KINDS = ("invalid_json", "missing_text", "non_utf8", "empty", "truncated")
UNKNOWN_SOURCE = "unknown"
CHUNK_BYTES = 1 << 20


class InputError(ValueError):
    """An input path that cannot be used; names the path."""


InputFile = collections.namedtuple("InputFile", "path name key size")


def _is_input(name):
    return name.endswith(INPUT_SUFFIXES)


def _key(name):
    """The stem shards of this input are named after: unique, safe in a file name."""
    for suffix in INPUT_SUFFIXES:
        if name.endswith(suffix):
            name = name[:-len(suffix)]
            break
    return re.sub(r"[^A-Za-z0-9._-]", "_", name.replace("/", "--"))


def find_inputs(paths):
    """Input files from files and directories (searched recursively, sorted), each checked readable."""
    if not paths:
        raise InputError("no input paths given")
    found = []
    for path in paths:
        if os.path.isdir(path):
            names = []
            for directory, subdirs, files in os.walk(path):
                subdirs.sort()
                names.extend(os.path.relpath(os.path.join(directory, name), path).replace(os.sep, "/")
                             for name in files if _is_input(name))
            if not names:
                raise InputError("%s: directory holds no %s files" % (path, " / ".join(INPUT_SUFFIXES)))
            found.extend((os.path.join(path, name), name) for name in sorted(names))
        elif os.path.exists(path):
            if not _is_input(path):
                raise InputError("%s: not an input file; expected a name ending in %s"
                                 % (path, ", ".join(INPUT_SUFFIXES)))
            found.append((path, os.path.basename(path)))
        else:
            raise InputError("%s: no such file or directory" % path)
    inputs, seen = [], {}
    for path, name in found:
        try:
            with open(path, "rb"):
                pass
        except OSError as error:
            raise InputError("%s: not readable: %s" % (path, error.strerror or error))
        key = _key(name)
        if key in seen:
            raise InputError("%s and %s would both be named %r in the output; rename one" % (seen[key], path, key))
        seen[key] = path
        inputs.append(InputFile(path, name, key, os.path.getsize(path)))
    return inputs


class Reader:
    """Documents of one input file; `rejected` counts what was left out, `position` the file bytes read."""

    def __init__(self, path, chunk_bytes=CHUNK_BYTES):
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.rejected = collections.Counter()
        self.position = 0

    def _chunks(self, handle):
        while True:
            chunk = handle.read(self.chunk_bytes)
            self.position += len(chunk)
            if not chunk:
                return
            yield chunk

    def _decompressed(self, handle):
        """Decompressed chunks; frames one after the other; a stream cut short ends quietly, counted."""
        decompressor = zstandard.ZstdDecompressor()
        frame, fed = decompressor.decompressobj(), False
        try:
            for chunk in self._chunks(handle):
                while chunk:
                    data = frame.decompress(chunk)
                    fed = True
                    if data:
                        yield data
                    if not frame.eof:
                        break
                    chunk = frame.unused_data
                    frame, fed = decompressor.decompressobj(), False
        except zstandard.ZstdError:
            self.rejected["truncated"] += 1
            return
        if fed and not frame.eof:
            self.rejected["truncated"] += 1

    def _lines(self):
        with open(self.path, "rb") as handle:
            chunks = self._chunks(handle) if self.path.endswith(".jsonl") else self._decompressed(handle)
            tail = b""
            for chunk in chunks:
                lines = (tail + chunk).split(b"\n")
                tail = lines.pop()
                yield from lines
            if tail and not self.rejected["truncated"]:
                yield tail

    def documents(self):
        """Yield (text, UTF-8 bytes of text, pile_set_name) for every good record, in file order."""
        for line in self._lines():
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError:
                self.rejected["non_utf8"] += 1
                continue
            except ValueError:
                self.rejected["invalid_json"] += 1
                continue
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                self.rejected["missing_text"] += 1
                continue
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate escaped in the JSON
                self.rejected["non_utf8"] += 1
                continue
            if not text.strip():
                self.rejected["empty"] += 1
                continue
            meta = record.get("meta")
            source = meta.get("pile_set_name") if isinstance(meta, dict) else None
            yield text, data, source if isinstance(source, str) and source else UNKNOWN_SOURCE
