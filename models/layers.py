"""Layers the shipped models share: position-keyed dropout and the dtype of the logits.

Dropout keyed by example, not by replica. Keras' Dropout draws its mask from a seed state that every replica holds
a copy of, so R replicas apply R copies of one mask, and the masks depend on how the global batch was split. Here
each training example's mask is a hash of (SEED, the example's position in the training stream, the layer's salt,
the unit): the same example gets the same mask at any replica or host count and after a resume, so a run with
dropout is replica-count invariant and exactly resumable like one without. The training step publishes the batch's
per-example keys with `example_keys(...)` around the model call (training/learning/step.py); each replica runs in its
own thread, so the keys are thread-local.

The hash is `lowbias32` (a 32-bit integer finaliser with low bias, C. Wellons, "Prospecting for Hash Functions"),
on uint32 tensors: a few integer ops per unit, vectorised, and XLA-compilable (TPUs included).
"""

import contextlib
import threading

import keras
import tensorflow as tf

from common.keyed_random import lowbias32

_state = threading.local()
_UNIFORM_SCALE = 2.0 ** -24  # 24 random bits -> a float in [0, 1) that float32 represents exactly.


@contextlib.contextmanager
def example_keys(keys: tf.Tensor):
    """Within this block (and thread), StatelessDropout layers draw each example's mask from `keys` [batch]."""
    previous = getattr(_state, "keys", None)
    _state.keys = keys
    try:
        yield
    finally:
        _state.keys = previous


class StatelessDropout(keras.layers.Layer):
    """Dropout whose mask is a function of (example key, `salt`, unit): see the module docstring.

    `salt` tells the model's dropout layers apart; give each layer of a model its own (0, 1, 2, ...). Called with
    training=True outside `example_keys` (e.g. from your own `model.fit`), it falls back to an ordinary random
    mask, which is neither replica-count invariant nor reproducible.
    """

    def __init__(self, rate: float, *, salt: int, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout rate {rate!r} must be in [0, 1).")
        self.rate, self.salt = float(rate), int(salt)

    def call(self, inputs, training=False):
        if not training or not self.rate:
            return inputs
        keys = getattr(_state, "keys", None)
        if keys is None:
            uniform = tf.random.uniform(tf.shape(inputs))
        else:
            uniform = self._keyed_uniform(inputs, keys)
        keep = tf.cast(uniform >= self.rate, inputs.dtype)
        return inputs * keep * tf.cast(1.0 / (1.0 - self.rate), inputs.dtype)

    def _keyed_uniform(self, inputs, keys):
        units = inputs.shape[1:]
        if not units.is_fully_defined():
            raise ValueError(f"StatelessDropout needs static shapes after the batch dimension; got {inputs.shape}.")
        unit_hash = lowbias32(tf.reshape(tf.cast(tf.range(units.num_elements()), tf.uint32), units))
        salt = tf.constant(self.salt * 0x9E3779B9 & 0xFFFFFFFF, tf.uint32)  # Spreads small salts over 32 bits.
        layer_keys = lowbias32(tf.bitwise.bitwise_xor(tf.cast(keys, tf.uint32), salt))
        layer_keys = tf.reshape(layer_keys, [-1] + [1] * len(units))
        bits = lowbias32(tf.bitwise.bitwise_xor(unit_hash[tf.newaxis], layer_keys))
        return tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), tf.float32) * _UNIFORM_SCALE

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "salt": self.salt}


def logits_dtype() -> str:
    """float32 logits under float32 and mixed precision (a stable softmax); float64 when the whole model is."""
    return "float64" if keras.config.dtype_policy().compute_dtype == "float64" else "float32"
