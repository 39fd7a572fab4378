import pytest

from lm.compat import tf
from seeding import set_random_seed

# The machine is shared: keep TensorFlow to a couple of threads.
tf.config.threading.set_intra_op_parallelism_threads(2)
# 2, as tests/smdist/conftest.py: the setting is per process and the last conftest collected wins, and the
# SMP fake needs an inter-op thread per rank (2 ranks) whatever order the directories are collected in.
tf.config.threading.set_inter_op_parallelism_threads(2)


@pytest.fixture
def seeded():
    set_random_seed(7)
