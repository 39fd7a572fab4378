"""What the fork recipes train on."""
import numpy as np
import pytest


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A few hundred records of random tokens below the tiny presets' vocabulary, as lm.spec.shards keeps
    them, with a word-level tokenizer of 256 tokens (the export carries it; generation loads it)."""
    from tokenizers import Tokenizer, models
    from training.conftest import write_dataset

    directory = tmp_path_factory.mktemp("data")
    tokenizer = directory / "tokenizer.json"
    Tokenizer(models.WordLevel({"t%d" % index: index for index in range(256)}, unk_token="t0")).save(str(tokenizer))
    tokens = np.random.default_rng(0).integers(1, 256, size=65 * 96)
    write_dataset(str(directory), tokens, 64, 256, str(tokenizer), val_records=16)
    return str(directory)
