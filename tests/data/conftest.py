"""Fixtures for the data-preparation tests: a small BPE tokenizer and small Pile-format corpora."""
import pytest

from lmstack import sample_corpus
from lm import tokenizer as tokenizers_lib
from prepare_helpers import read_records


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory):
    """A byte-level BPE (vocab 2000) trained on a slice of the sample corpus: quick to train and to use."""
    texts = [doc["text"] for doc in sample_corpus.sample_documents(300000, seed=1)]
    path = str(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")
    tokenizers_lib.save(tokenizers_lib.train_bpe(texts, vocab_size=2000), path)
    return path


@pytest.fixture
def corpus(tmp_path):
    """Two small .jsonl.zst files; returns (directory, {file name: [records]})."""
    directory = str(tmp_path / "raw")
    sample_corpus.write_sample_corpus(directory, max_bytes=240000, files=2)
    return directory, read_records(directory)
