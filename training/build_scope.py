"""A scope in which a run's model is built reproducibly, without leaving process-wide state behind.

Keras takes a layer's dtype from a process-wide policy, and an unseeded initializer draws its seed from Python's
`random` module. So the same SEED gives the same initial weights only if both are set while the model is built;
setting them for good (as `keras.utils.set_random_seed` does) would change every later model in the process: a test
or notebook that builds a float64 Trainer would turn its next model float64. Building inside `seeded_build` sets them
for the build only.
"""

import contextlib
import random

import keras
import numpy as np
import tensorflow as tf

from common.settings import require_choice, require_int


@contextlib.contextmanager
def seeded_build(precision: str, seed: int):
    """Inside: Keras' dtype policy is `precision`, and Python's, NumPy's and TensorFlow's random number generators and
    Keras' seed generator start from `seed` (the same SEED, the same initial weights).

    On exit the previous dtype policy, the Python and NumPy generator states and TensorFlow's global seed come back.
    Keras' global seed generator is left unset, as after `keras.utils.set_random_seed`: it is drawn again from
    Python's restored generator when next needed. Layers keep the dtype they were built with.
    """
    policy = keras.config.dtype_policy()
    python_state, numpy_state = random.getstate(), np.random.get_state()
    tensorflow_seed, _ = tf.compat.v1.get_seed(None)
    keras.config.set_dtype_policy(precision)
    keras.utils.set_random_seed(seed)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(policy)
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        tf.random.set_seed(tensorflow_seed)


# float64: the replica-invariance check's precision (exact math to ~1e-15); on CPUs only, slow elsewhere.
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16", "float64")
# keras.utils.set_random_seed seeds NumPy's legacy generator with SEED, which takes 0 .. 2**32 - 1 only.
MAX_SEED = 2 ** 32 - 1


def check_settings(config) -> None:
    """SEED and PRECISION, as the build uses them."""
    require_int("seed", config.seed, minimum=0, example=0, maximum=MAX_SEED, why="2**32 - 1: NumPy's seed range")
    require_choice("precision", config.precision, PRECISIONS)
