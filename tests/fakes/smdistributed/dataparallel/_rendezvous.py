"""Where the ranks of a FAKE smdistributed job meet (tests only): one process per rank.

`DirectoryRendezvous(directory, rank, size).exchange(contribution)` returns every rank's
contribution to the same collective, in rank order. The n-th collective a rank calls meets the
n-th collective of every other rank: each rank writes one file per collective into a directory
they all share (`<n>.<rank>`, written under a temporary name and renamed) and reads the
others' files of that n. Ranks run the same program, so their n-th calls are the same call; the
caller checks that they are. Within a `tf.function` the collectives are stateful
`tf.numpy_function` ops, which TensorFlow runs in program order.

Ranks could not be threads of one process: a `tf.function` that blocks in a
`tf.numpy_function` until another thread's `tf.function` reaches its own never returns.
"""
import os
import pickle
import time


class RendezvousTimeout(RuntimeError):
    """A rank did not reach a collective the others reached."""


class DirectoryRendezvous:
    def __init__(self, directory, rank, size, timeout_s=120.0):
        self.directory, self.rank, self.size, self.timeout_s = directory, rank, size, timeout_s
        self._count = 0

    def _path(self, number, rank):
        return os.path.join(self.directory, "%08d.%d" % (number, rank))

    def exchange(self, contribution, what="a collective"):
        number, self._count = self._count, self._count + 1
        if self.size == 1:
            return [contribution]
        mine = self._path(number, self.rank)
        with open(mine + ".tmp", "wb") as handle:
            pickle.dump(contribution, handle, protocol=4)
        os.replace(mine + ".tmp", mine)
        if number >= 2:
            # Every rank has read collective number - 2: it reached number - 1 only after that.
            os.remove(self._path(number - 2, self.rank))
        gathered = []
        for rank in range(self.size):
            gathered.append(contribution if rank == self.rank else self._read(number, rank, what))
        return gathered

    def _read(self, number, rank, what):
        path = self._path(number, rank)
        deadline, pause = time.monotonic() + self.timeout_s, 0.0005
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise RendezvousTimeout("fake smdistributed: rank %d waited %.0f s for rank %d to reach collective "
                                        "#%d (%s); did that rank fail or call other collectives?"
                                        % (self.rank, self.timeout_s, rank, number, what))
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        with open(path, "rb") as handle:
            return pickle.load(handle)
