"""Shared fixtures: a small real-text token dataset in the `lm.spec.shards` format.

The text is the Python documentation's prose (`pydoc_data.topics`), tokenized with a
byte-level BPE trained on it (vocabulary <= the `tiny` preset's 512).
"""
import os

import numpy as np
import pytest

from lm.spec import shards

SEQ_LEN = 64
VOCAB_SIZE = 512


def write_dataset(directory, tokens, seq_len, vocab_size, tokenizer_file, val_records=64, shard_records=2000):
    """Cut a token array into records of seq_len + 1 and write train/val shards + manifest."""
    dtype = shards.dtype_for_vocab(vocab_size)
    width = seq_len + 1
    records = np.asarray(tokens[: len(tokens) // width * width], np.dtype(dtype).newbyteorder("<")).reshape(-1, width)
    splits = {"val": records[:val_records], "train": records[val_records:]}
    manifest = shards.Manifest(dtype=dtype, seq_len=seq_len, vocab_size=vocab_size, eod_token_id=0,
                               tokenizer_file=os.path.basename(tokenizer_file),
                               tokenizer_sha256=shards.sha256_file(tokenizer_file))
    for split, rows in splits.items():
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        for index, start in enumerate(range(0, len(rows), shard_records)):
            part = rows[start:start + shard_records]
            relative = "%s/%05d.bin" % (split, index)
            shards.write_atomically(os.path.join(directory, relative), part.tobytes())
            manifest.shards.append(shards.Shard(path=relative, split=split, records=len(part),
                                                bytes=part.nbytes,
                                                sha256=shards.sha256_file(os.path.join(directory, relative))))
    shards.save_manifest(directory, manifest)
    return manifest


@pytest.fixture(scope="session")
def text_dataset(tmp_path_factory):
    from pydoc_data.topics import topics

    from lm import tokenizer as lm_tokenizer

    directory = str(tmp_path_factory.mktemp("text_dataset"))
    texts = [topics[name] for name in sorted(topics)]
    bpe = lm_tokenizer.train_bpe(texts, vocab_size=VOCAB_SIZE)
    tokenizer_file = os.path.join(directory, "tokenizer.json")
    lm_tokenizer.save(bpe, tokenizer_file)
    tokens = []
    for encoding in bpe.encode_batch(texts):
        tokens.extend(encoding.ids)
        tokens.append(0)
    write_dataset(directory, np.array(tokens), SEQ_LEN, bpe.get_vocab_size(), tokenizer_file)
    return directory
