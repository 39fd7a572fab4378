"""Bits per UTF-8 byte for each source of the held-out documents, as the Pile paper reports them
(Gao et al. 2020, table 2: one figure per component and the total).

The documents are JSONL lines {"text": ..., "meta": {"pile_set_name": ...}}: a file, or what
`lm.data.prepare` keeps of the validation split in a dataset directory (`lm.spec.shards`,
val_documents/<input>.jsonl, listed in its manifest). Each document is scored alone with
rolling log-likelihood (`Scorer.rolling_loglikelihoods`, lm-eval's windows; the first token conditions
on the end-of-document token), and a source's bits per byte is the sum of its documents'
-log2 likelihoods over the sum of their UTF-8 bytes.
"""
import json
import math
import os

UNKNOWN_SOURCE = "unknown"


class DocumentsError(ValueError):
    """A documents file line that is not {"text": str, "meta": {"pile_set_name": str}}; names the line."""


def read_documents(path):
    """[(source, text)] of a JSONL documents file; a line without meta.pile_set_name is UNKNOWN_SOURCE."""
    documents = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError as error:
                raise DocumentsError("%s:%d: not JSON: %s" % (path, number, error))
            text = data.get("text") if isinstance(data, dict) else None
            if not isinstance(text, str):
                raise DocumentsError("%s:%d: needs a string field 'text'" % (path, number))
            meta = data.get("meta")
            source = meta.get("pile_set_name") if isinstance(meta, dict) else None
            documents.append((source if isinstance(source, str) and source else UNKNOWN_SOURCE, text))
    return documents


def _figures(logprob, tokens, text_bytes, documents):
    return {"bits_per_byte": -logprob / math.log(2) / text_bytes if text_bytes else None, "tokens": tokens,
            "bytes": text_bytes, "documents": documents}


def bits_per_byte(scorer, documents):
    """{"sources": {name: {"bits_per_byte", "tokens", "bytes", "documents"}}, "total": {...}} of
    [(source, text)] documents (empty texts are skipped: they have no bytes to predict)."""
    documents = [(source, text) for source, text in documents if text]
    token_lists = [scorer.encode(text) for _, text in documents]
    logprobs = scorer.rolling_loglikelihoods(token_lists)
    sums = {}
    for (source, text), tokens, logprob in zip(documents, token_lists, logprobs):
        entry = sums.setdefault(source, [0.0, 0, 0, 0])
        entry[0] += logprob
        entry[1] += len(tokens)
        entry[2] += len(text.encode("utf-8"))
        entry[3] += 1
    total = [sum(entry[i] for entry in sums.values()) for i in range(4)]
    return {"sources": {source: _figures(*sums[source]) for source in sorted(sums)}, "total": _figures(*total)}


def documents_files(path):
    """The JSONL files of `path`: itself, or a prepared dataset directory's validation documents."""
    if os.path.isdir(path):
        from lm.spec import shards

        return shards.val_documents_files(path)
    if not os.path.isfile(path):
        raise DocumentsError("documents %s: neither a JSONL file nor a prepared dataset directory" % path)
    return [path]


def pile_bpb(scorer, path):
    """bits_per_byte of the documents in the JSONL file at `path`, or of a prepared dataset
    directory's validation documents."""
    return bits_per_byte(scorer, [document for name in documents_files(path) for document in read_documents(name)])
