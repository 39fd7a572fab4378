"""Batches of token sequences from `lm.spec.shards` datasets, deterministic and resumable.

The order is defined globally, independent of how many ranks read it:

- Each shard is cut into blocks of `block_records` consecutive records (a shard's tail that
  does not fill a block is left out). Epoch `e` visits every block once, in a permutation
  drawn from (seed, e) alone, never from timing.
- Global batch `k` of an epoch is records `[k*G, (k+1)*G)` of that permuted stream (G =
  global batch size); data-parallel rank `r` of `P` reads only its slice
  `[k*G + r*G/P, k*G + (r+1)*G/P)`. The slices are disjoint, their union is the global
  batch, so P ranks averaging their gradients compute what one process with the whole batch
  computes. Incomplete batches at the end of an epoch are dropped.
- The index is made from the manifest's record counts (one number per shard): nothing per
  record or per block is built at start-up, so opening a split of the Pile's ~146 M records
  costs what opening a small one does (`bench/data_index.py`: `lm.training.train --dry-run` on 10^8
  records). Record positions become (shard, record) a chunk of batches at a time, as they are
  read; the one array that grows with the data is an epoch's block permutation (4 bytes per
  block), drawn when the epoch's first chunk is read.
- A rank turns its slices into runs of consecutive records in one file and reads each run
  with one `os.pread`, a few chunks of batches ahead on a thread pool (reads release the GIL; on EFS
  the latency of one read hides behind the others), and hands whole batches to tf.data,
  which prefetches. `tf.data.FixedLengthRecordDataset` is not used: it reaches its
  `header_bytes` by reading through them (measured: a 4 KiB record at the end of a 1 GiB
  shard costs 4x one at the start), so random access into 1 GiB shards would read them whole.

The stream position is the global step alone (every epoch has the same number of steps), so
a run resumed at step s sees exactly the batches an uninterrupted run sees from step s.
"""
import collections
import concurrent.futures
import itertools
import os
import threading

import numpy as np

from lm.spec import shards
from lm.compat import tf

DEFAULT_BLOCK_RECORDS = 16
DEFAULT_READERS = 8
CHUNK_BYTES = 1 << 20


class TokenStream:
    """One split of a dataset directory, as this data-parallel rank sees it."""

    def __init__(self, directory, split, *, global_batch_size, dp_rank=0, dp_size=1, seed=0, shuffle=True,
                 seq_len=None, vocab_size=None, block_records=DEFAULT_BLOCK_RECORDS,
                 readers=DEFAULT_READERS):
        if split not in shards.SPLITS:
            raise ValueError("split must be one of %s, got %r" % (", ".join(shards.SPLITS), split))
        if global_batch_size % dp_size:
            raise ValueError("global_batch_size (%d) must be divisible by the data-parallel size (%d)"
                             % (global_batch_size, dp_size))
        if not 0 <= dp_rank < dp_size:
            raise ValueError("dp_rank %d is outside [0, %d)" % (dp_rank, dp_size))
        self.directory = directory
        self.split = split
        self.manifest = shards.load_manifest(directory)
        shards.check(directory, self.manifest, seq_len=seq_len, vocab_size=vocab_size)
        self.seq_len = self.manifest.seq_len
        self.global_batch_size = global_batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.batch_size = global_batch_size // dp_size
        self.seed, self.shuffle = seed, shuffle
        self.block_records = block_records
        self.readers = readers
        # Whole batches per read task, about CHUNK_BYTES: Python and tf.data costs per chunk, not per batch.
        self.chunk_batches = max(1, CHUNK_BYTES // (self.batch_size * self.manifest.record_bytes))
        self._open_lock = threading.Lock()
        self._files = [os.path.join(directory, shard.path) for shard in self.manifest.split_shards(split)]
        # The index is O(shards): block k of the split is block k - _first_block[i] of shard i, the
        # blocks numbered shard by shard from each shard's first record. Record positions are
        # turned into (shard, record) per chunk of batches as they are read (`runs`).
        blocks_per_shard = [shard.records // block_records for shard in self.manifest.split_shards(split)]
        self._first_block = np.concatenate([[0], np.cumsum(blocks_per_shard, dtype=np.int64)])
        self.blocks = int(self._first_block[-1])
        self._order = (None, None)  # (epoch, its block permutation): one epoch is read at a time
        self.steps_per_epoch = self.blocks * block_records // global_batch_size
        if self.steps_per_epoch < 1:
            raise shards.ShardError(
                "%s: split %r has %d usable records (blocks of %d), fewer than one global batch of %d"
                % (shards.manifest_path(directory), split, self.blocks * block_records, block_records,
                   global_batch_size))

    @property
    def tokens_per_step(self):
        """Tokens of input per global batch (labels excluded)."""
        return self.global_batch_size * self.seq_len

    def position(self, step):
        """(epoch, batch within the epoch) of global step `step`."""
        return divmod(step, self.steps_per_epoch)

    def block_order(self, epoch):
        """The permutation of blocks for `epoch`, a function of (seed, epoch) only; None: file order.

        NumPy's RandomState permutation, the order every earlier version read (so runs resume
        exactly across versions). It is the one array the index holds, 4 bytes per block of
        `block_records` records (a quarter of a byte per record at the default 16: 36 MB for the
        Pile's ~146 M records), made when an epoch's first chunk is read, never at start-up."""
        if not self.shuffle:
            return None
        if self._order[0] != epoch:
            order = np.random.RandomState([self.seed % (2 ** 32), epoch % (2 ** 32)]).permutation(self.blocks)
            self._order = (epoch, order.astype(np.int32) if self.blocks < 2 ** 31 else order)
        return self._order[1]

    def runs(self, epoch, first_batch=0, end_batch=None):
        """This rank's reads for batches [first_batch, end_batch) of `epoch` (end_batch None: the epoch's
        end): arrays (file index, first record, records).

        Runs never cross a batch boundary, so they concatenate to whole local batches in order.
        """
        end_batch = self.steps_per_epoch if end_batch is None else min(end_batch, self.steps_per_epoch)
        batches = np.arange(first_batch, end_batch, dtype=np.int64)
        offsets = batches * self.global_batch_size + self.dp_rank * self.batch_size
        positions = (offsets[:, None] + np.arange(self.batch_size, dtype=np.int64)[None, :]).reshape(-1)
        block = positions // self.block_records
        order = self.block_order(epoch)
        if order is not None:
            block = order[block].astype(np.int64)
        shard = np.searchsorted(self._first_block, block, side="right") - 1
        record = (block - self._first_block[shard]) * self.block_records + positions % self.block_records
        starts = np.ones(len(positions), bool)
        starts[1:] = ((shard[1:] != shard[:-1]) | (record[1:] != record[:-1] + 1)
                      | (np.arange(1, len(positions)) % self.batch_size == 0))
        first = np.flatnonzero(starts)
        lengths = np.diff(np.append(first, len(positions)))
        return shard[first], record[first], lengths

    def chunk_runs(self, epoch, first_batch=0):
        """The runs of this epoch from `first_batch`, made one chunk of `chunk_batches` whole local
        batches at a time: lists of (file index, first record, records)."""
        for start in range(first_batch, self.steps_per_epoch, self.chunk_batches):
            yield list(zip(*(part.tolist() for part in self.runs(epoch, start, start + self.chunk_batches))))

    def _read_chunk(self, handles, runs):
        """[batches, batch_size, seq_len + 1] tokens: the runs read and concatenated in order."""
        record_bytes = self.manifest.record_bytes
        dtype = "<u2" if self.manifest.dtype == "uint16" else "<i4"
        parts = []
        for shard, record, count in runs:
            path = self._files[shard]
            with self._open_lock:
                if path not in handles:
                    handles[path] = os.open(path, os.O_RDONLY)
            want = int(count) * record_bytes
            raw = os.pread(handles[path], want, int(record) * record_bytes)
            if len(raw) != want:
                raise shards.ShardError("%s: short read at record %d (file changed after it was verified?)"
                                        % (path, record))
            parts.append(np.frombuffer(raw, dtype))
        return np.concatenate(parts).reshape(-1, self.batch_size, self.seq_len + 1)

    def _generate(self, epoch, first_batch):
        handles = {}
        chunks = self.chunk_runs(epoch, first_batch)
        pending = collections.deque()
        try:
            with concurrent.futures.ThreadPoolExecutor(self.readers) as pool:
                for runs in itertools.islice(chunks, self.readers):
                    pending.append(pool.submit(self._read_chunk, handles, runs))
                while pending:
                    tokens = pending.popleft().result()
                    for runs in itertools.islice(chunks, 1):
                        pending.append(pool.submit(self._read_chunk, handles, runs))
                    yield tokens
        finally:
            for handle in handles.values():
                os.close(handle)

    def dataset(self, epoch, first_batch=0):
        """tf.data.Dataset of (inputs, labels), int32 [batch_size, seq_len], for one epoch from `first_batch`."""
        dtype = tf.uint16 if self.manifest.dtype == "uint16" else tf.int32
        data = tf.data.Dataset.from_generator(
            lambda: self._generate(epoch, first_batch),
            output_signature=tf.TensorSpec([None, self.batch_size, self.seq_len + 1], dtype))

        def split(tokens):
            tokens = tf.cast(tokens, tf.int32)
            return tokens[:, :, :-1], tokens[:, :, 1:]

        return data.map(split).unbatch().prefetch(2)

    def batches(self, start_step=0):
        """(inputs, labels) for global steps start_step, start_step + 1, ..., across epochs, forever."""
        epoch, first_batch = self.position(start_step)
        while True:
            yield from self.dataset(epoch, first_batch)
            epoch, first_batch = epoch + 1, 0
