"""lm.data.dataset: disjoint rank slices whose union is the global batch, seeded order, exact resume, clear errors."""
import os
import shutil
import sys
import tracemalloc

import numpy as np
import pytest

from lm.spec import shards
from lm.data.dataset import TokenStream

from .conftest import write_dataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import data_index  # noqa: E402  (bench/data_index.py: its sparse dataset)


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    """Records whose first token is their index in the dataset (train records start at 1000)."""
    directory = str(tmp_path_factory.mktemp("numbered"))
    seq_len, count = 8, 1000 + 3 * 160
    tokens = np.zeros((count, seq_len + 1), np.int64)
    tokens[:, 0] = np.arange(count) % 65536
    tokens[:, 1:] = np.arange(1, seq_len + 1)
    tokenizer = os.path.join(directory, "tokenizer.json")
    with open(tokenizer, "w") as handle:
        handle.write("{}")
    write_dataset(directory, tokens.reshape(-1), seq_len, 512, tokenizer, val_records=1000, shard_records=160)
    return directory


def first_tokens(stream, start_step, steps):
    batches = stream.batches(start_step)
    out = [next(batches)[0].numpy()[:, 0] for _ in range(steps)]
    batches.close()
    return np.stack(out)


def test_inputs_and_labels_are_shifted_by_one(numbered):
    inputs, labels = next(TokenStream(numbered, "train", global_batch_size=4, block_records=4).batches())
    assert inputs.shape == labels.shape == (4, 8)
    assert inputs.dtype.name == labels.dtype.name == "int32"
    np.testing.assert_array_equal(inputs.numpy()[:, 1:], labels.numpy()[:, :-1])
    np.testing.assert_array_equal(labels.numpy()[:, -1], np.full(4, 8))


@pytest.mark.parametrize("dp_size", [2, 4])
def test_ranks_read_disjoint_slices_that_make_the_global_batch(numbered, dp_size):
    whole = first_tokens(TokenStream(numbered, "train", global_batch_size=8, seed=3, block_records=4), 0, 10)
    parts = [first_tokens(TokenStream(numbered, "train", global_batch_size=8, seed=3, block_records=4,
                                      dp_rank=rank, dp_size=dp_size), 0, 10) for rank in range(dp_size)]
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), whole)
    seen = np.concatenate([part.reshape(-1) for part in parts])
    assert len(set(seen.tolist())) == len(seen)


def test_one_epoch_visits_every_block_once_in_a_seeded_order(numbered):
    stream = TokenStream(numbered, "train", global_batch_size=8, seed=3, block_records=4)
    assert stream.steps_per_epoch == 480 // 8
    epoch0 = first_tokens(stream, 0, stream.steps_per_epoch).reshape(-1)
    assert sorted(epoch0.tolist()) == list(range(1000, 1480))
    epoch1 = first_tokens(stream, stream.steps_per_epoch, stream.steps_per_epoch).reshape(-1)
    assert sorted(epoch1.tolist()) == list(range(1000, 1480))
    assert not np.array_equal(epoch0, epoch1)
    again = TokenStream(numbered, "train", global_batch_size=8, seed=3, block_records=4)
    np.testing.assert_array_equal(first_tokens(again, 0, 5).reshape(-1), epoch0[:40])
    other_seed = TokenStream(numbered, "train", global_batch_size=8, seed=4, block_records=4)
    assert not np.array_equal(first_tokens(other_seed, 0, 5).reshape(-1), epoch0[:40])


def test_resuming_at_a_step_gives_the_same_batches_across_an_epoch_boundary(numbered):
    stream = TokenStream(numbered, "train", global_batch_size=8, seed=3, block_records=4)
    straight = first_tokens(stream, 0, stream.steps_per_epoch + 5)
    resumed = first_tokens(stream, stream.steps_per_epoch - 3, 8)
    np.testing.assert_array_equal(resumed, straight[-8:])


def test_blocks_are_contiguous_runs_of_records(numbered):
    batch = first_tokens(TokenStream(numbered, "train", global_batch_size=8, seed=3, block_records=4), 0, 1)[0]
    for start in range(0, 8, 4):
        run = batch[start:start + 4]
        np.testing.assert_array_equal(np.diff(run), np.ones(3))


def test_unshuffled_stream_is_in_file_order(numbered):
    stream = TokenStream(numbered, "val", global_batch_size=10, shuffle=False, block_records=4)
    np.testing.assert_array_equal(first_tokens(stream, 0, 2).reshape(-1), np.arange(20))


@pytest.fixture()
def copy(numbered, tmp_path):
    target = str(tmp_path / "copy")
    shutil.copytree(numbered, target)
    return target


def test_truncated_shard_is_an_error_naming_the_file(copy):
    path = os.path.join(copy, "train", "00001.bin")
    with open(path, "r+b") as handle:
        handle.truncate(100)
    with pytest.raises(shards.ShardError, match="00001.bin"):
        TokenStream(copy, "train", global_batch_size=8)


def test_start_up_reads_no_shard_bytes_a_corrupt_shard_is_for_verify(copy):
    path = os.path.join(copy, "train", "00002.bin")
    with open(path, "r+b") as handle:
        handle.write(b"\xff\xff")
    TokenStream(copy, "train", global_batch_size=8)  # sizes agree: start-up does not hash
    problems = shards.verify(copy, shards.load_manifest(copy))
    assert len(problems) == 1 and "00002.bin: sha256 does not match" in problems[0]


def test_missing_tokenizer_is_an_error_at_start(copy):
    os.remove(os.path.join(copy, "tokenizer.json"))
    with pytest.raises(shards.ShardError, match="manifest.json: tokenizer tokenizer.json is missing"):
        TokenStream(copy, "train", global_batch_size=8)


def test_model_mismatches_are_errors_naming_the_manifest(copy):
    with pytest.raises(shards.ShardError, match="manifest.json.*seq_len 8 does not match the model's 16"):
        TokenStream(copy, "train", global_batch_size=8, seq_len=16)
    with pytest.raises(shards.ShardError, match="manifest.json.*vocab_size 512 exceeds the model's 256"):
        TokenStream(copy, "train", global_batch_size=8, vocab_size=256)


def test_too_small_a_split_for_one_batch_is_an_error(copy):
    with pytest.raises(shards.ShardError, match="fewer than one global batch"):
        TokenStream(copy, "train", global_batch_size=1024)


def test_missing_manifest_is_an_error(tmp_path):
    with pytest.raises(shards.ShardError, match="manifest.json"):
        TokenStream(str(tmp_path), "train", global_batch_size=8)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="divisible by the data-parallel size"):
        TokenStream("unused", "train", global_batch_size=9, dp_size=2)
    with pytest.raises(ValueError, match="split must be one of train, val"):
        TokenStream("unused", "test", global_batch_size=8)



# ---- the on-demand index against the whole-epoch arrays it replaced ----

def whole_epoch_runs(directory, split, *, global_batch_size, dp_rank, dp_size, seed, shuffle, block_records,
                     epoch, first_batch):
    """The index lm.data.dataset built until it became O(shards): per-block arrays of shard and first record,
    every record position of the epoch, and the runs cut from them. The order the new index must keep."""
    manifest = shards.load_manifest(directory)
    blocks = [(index, start) for index, shard in enumerate(manifest.split_shards(split))
              for start in range(0, shard.records - block_records + 1, block_records)]
    block_shard = np.array([b[0] for b in blocks], np.int64)
    block_start = np.array([b[1] for b in blocks], np.int64)
    steps_per_epoch = len(blocks) * block_records // global_batch_size
    batch_size = global_batch_size // dp_size
    batches = np.arange(first_batch, steps_per_epoch, dtype=np.int64)
    offsets = batches * global_batch_size + dp_rank * batch_size
    positions = (offsets[:, None] + np.arange(batch_size, dtype=np.int64)[None, :]).reshape(-1)
    order = (np.random.RandomState([seed % (2 ** 32), epoch % (2 ** 32)]).permutation(len(block_shard))
             if shuffle else np.arange(len(block_shard)))
    block = order[positions // block_records]
    shard = block_shard[block]
    record = block_start[block] + positions % block_records
    starts = np.ones(len(positions), bool)
    starts[1:] = ((shard[1:] != shard[:-1]) | (record[1:] != record[:-1] + 1)
                  | (np.arange(1, len(positions)) % batch_size == 0))
    first = np.flatnonzero(starts)
    return shard[first], record[first], np.diff(np.append(first, len(positions))), steps_per_epoch


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    """Shards of 37 records: with blocks of 4 or 16, every shard has a tail the index leaves out."""
    directory = str(tmp_path_factory.mktemp("ragged"))
    tokens = np.zeros((40 + 37 * 13, 9), np.int64)
    tokens[:, 0] = np.arange(len(tokens))
    tokenizer = os.path.join(directory, "tokenizer.json")
    with open(tokenizer, "w") as handle:
        handle.write("{}")
    write_dataset(directory, tokens.reshape(-1), 8, 512, tokenizer, val_records=40, shard_records=37)
    return directory


@pytest.mark.parametrize("seed", [0, 3, 2 ** 33 + 5])
@pytest.mark.parametrize("block_records,global_batch_size,dp_size", [(4, 8, 1), (4, 12, 3), (16, 32, 2), (1, 6, 2)])
def test_on_demand_index_keeps_the_whole_epoch_arrays_order(ragged, seed, block_records, global_batch_size, dp_size):
    for shuffle in (True, False):
        for dp_rank in range(dp_size):
            stream = TokenStream(ragged, "train", global_batch_size=global_batch_size, dp_rank=dp_rank,
                                 dp_size=dp_size, seed=seed, shuffle=shuffle, block_records=block_records)
            for epoch in (0, 1, 2, 2 ** 32 + 1):
                for first_batch in (0, 1, stream.steps_per_epoch // 2, stream.steps_per_epoch - 1):
                    *expected, steps = whole_epoch_runs(
                        ragged, "train", global_batch_size=global_batch_size, dp_rank=dp_rank, dp_size=dp_size,
                        seed=seed, shuffle=shuffle, block_records=block_records, epoch=epoch,
                        first_batch=first_batch)
                    assert stream.steps_per_epoch == steps
                    for got, want in zip(stream.runs(epoch, first_batch), expected):
                        np.testing.assert_array_equal(got, want)
                    chunks = list(stream.chunk_runs(epoch, first_batch))
                    assert [run for chunk in chunks for run in chunk] == list(zip(*(part.tolist() for part in expected)))
                    whole = stream.batch_size * stream.chunk_batches
                    assert all(sum(count for _, _, count in chunk) == whole for chunk in chunks[:-1])


def test_the_index_is_made_from_the_manifests_counts_not_per_record_or_per_block(tmp_path):
    """2 x 10^7 records of 2,049 tokens (sparse shards): opening a stream and reading the first chunk
    allocates what the shards' count sets, not what the records' does (the whole-epoch index held
    per-block arrays and a Python tuple per block at start-up, over 100 MB here). Unshuffled: the
    one O(blocks) array, an epoch's permutation, is the order's own price (see lm.data.dataset.block_order)."""
    data_index.sparse_dataset(str(tmp_path), 2 * 10 ** 7)
    tracemalloc.start()
    try:
        stream = TokenStream(str(tmp_path), "train", global_batch_size=512, shuffle=False)
        first = next(stream.chunk_runs(0, 0))
        last = next(stream.chunk_runs(0, stream.steps_per_epoch - 1))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, "%.1f MiB" % (peak / 2 ** 20)
    assert first[0][:2] == (0, 0) and sum(count for _, _, count in last) == 512
