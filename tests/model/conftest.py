import pytest

from lm.compat import tf
from seeding import set_random_seed

# The machine is shared: keep TensorFlow to a couple of threads.
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(1)


@pytest.fixture
def seeded():
    set_random_seed(7)
