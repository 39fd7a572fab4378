"""Training checkpoints: every state variable as a NumPy array, plus a little metadata.

    <dir>/ckpt-<step, 8 digits><tag>.npz

Written under a temporary name and renamed, so a file with the final name is always
complete and the newest one is safe to resume from. The variables are saved in a fixed
order (model weights, optimizer state, loss scale) with their shapes, and checked on load.
NumPy files read the same on every TF version we run, unlike Keras' checkpoint layouts.
"""
import json
import os
import re

import numpy as np

PATTERN = re.compile(r"^ckpt-(\d{8})(.*)\.npz$")
META_KEY = "__meta__"


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model being trained; names the file."""


def checkpoint_name(step, tag=""):
    return "ckpt-%08d%s.npz" % (step, tag)


class Checkpointer:
    """Saves and finds checkpoints in `directory`; `tag` separates ranks that hold different variables."""

    def __init__(self, directory, tag="", keep=2):
        self.directory, self.tag, self.keep = directory, tag, keep

    def steps(self):
        """Steps of the complete checkpoints with this tag, oldest first."""
        if not os.path.isdir(self.directory):
            return []
        found = []
        for name in os.listdir(self.directory):
            match = PATTERN.match(name)
            if match and match.group(2) == self.tag:
                found.append(int(match.group(1)))
        return sorted(found)

    def path(self, step):
        return os.path.join(self.directory, checkpoint_name(step, self.tag))

    def latest(self):
        steps = self.steps()
        return self.path(steps[-1]) if steps else None

    def save(self, step, variables, meta):
        """Write the values of `variables` at `step`; keep the newest `keep`. Returns the path."""
        os.makedirs(self.directory, exist_ok=True)
        arrays = {"v%05d" % index: np.asarray(variable.numpy()) for index, variable in enumerate(variables)}
        meta = dict(meta, step=step, shapes=[list(array.shape) for array in arrays.values()])
        arrays[META_KEY] = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), np.uint8)
        path = self.path(step)
        tmp = "%s.tmp-%d" % (path, os.getpid())
        with open(tmp, "wb") as handle:
            np.savez(handle, **arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        for old in self.steps()[:-self.keep] if self.keep else []:
            os.remove(self.path(old))
        return path


def read_meta(path):
    with np.load(path) as data:
        return json.loads(bytes(data[META_KEY]).decode("utf-8"))


def restore(path, variables):
    """Assign a checkpoint's arrays to `variables` (same order and shapes). Returns its metadata."""
    try:
        with np.load(path) as data:
            meta = json.loads(bytes(data[META_KEY]).decode("utf-8"))
            arrays = [data["v%05d" % index] for index in range(len(meta["shapes"]))]
    except (OSError, KeyError, ValueError) as error:
        raise CheckpointError("%s: not a readable checkpoint: %s" % (path, error))
    if len(arrays) != len(variables):
        raise CheckpointError("%s: holds %d variables, the model being trained has %d (different model?)"
                              % (path, len(arrays), len(variables)))
    for index, (array, variable) in enumerate(zip(arrays, variables)):
        if tuple(array.shape) != tuple(variable.shape):
            raise CheckpointError("%s: variable %d (%s) has shape %s, the model has %s"
                                  % (path, index, variable.name, array.shape, tuple(variable.shape)))
    for array, variable in zip(arrays, variables):
        variable.assign(array)
    return meta
