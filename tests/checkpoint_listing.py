"""The files of a checkpoint directory as the tests compare them (on every runtime: tests/tf26 imports it too)."""
import os

from lm.training.goodput import PROGRESS_FILE


def checkpoint_files(directory):
    """The checkpoints in `directory`, sorted: the goodput ledger (lm.training.goodput) is kept beside them."""
    return sorted(name for name in os.listdir(directory) if name != PROGRESS_FILE)
