"""Seeding for tests that run on every Keras the image ships with, TF 2.6's included."""
import random

import numpy as np

from lm.compat import keras, tf


def set_random_seed(seed):
    """keras.utils.set_random_seed (Keras >= 2.7); on TF 2.6's keras, which lacks it, the generators
    its initializers draw from."""
    if hasattr(keras.utils, "set_random_seed"):
        keras.utils.set_random_seed(seed)
    else:
        random.seed(seed)
        np.random.seed(seed)
        tf.random.set_seed(seed)
