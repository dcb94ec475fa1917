"""Random numbers that are a hash of a key: integer ops only, so the same with and without XLA on every device.

tf.random's stateless ops are a function of their seed on one device and compiler, but pick another generator under
XLA (and on TPUs). Draws that must be the same everywhere (dropout masks, models/layers.py; augmentation, tasks/ and
tasks/augmentation/mixing.py) hash a key with `lowbias32` (a 32-bit integer finaliser with low bias, C. Wellons,
"Prospecting for Hash Functions") instead.
"""

import numpy as np
import tensorflow as tf

_UNIFORM_SCALE = 2.0 ** -24  # 24 random bits -> a float that float32 represents exactly.


def lowbias32(values: tf.Tensor) -> tf.Tensor:
    """Hashes uint32 values elementwise (a bijection on 32-bit integers with well-mixed output bits)."""
    values = tf.bitwise.bitwise_xor(values, tf.bitwise.right_shift(values, tf.constant(16, tf.uint32)))
    values = values * tf.constant(0x7FEB352D, tf.uint32)
    values = tf.bitwise.bitwise_xor(values, tf.bitwise.right_shift(values, tf.constant(15, tf.uint32)))
    values = values * tf.constant(0x846CA68B, tf.uint32)
    return tf.bitwise.bitwise_xor(values, tf.bitwise.right_shift(values, tf.constant(16, tf.uint32)))


def seed_keys(seeds: tf.Tensor) -> tf.Tensor:
    """uint32 keys [n] from stateless seeds [n, 2] (int64: SEED, position), hashing all four 32-bit words."""
    seeds = tf.cast(seeds, tf.int64)
    key = tf.zeros(tf.shape(seeds)[:1], tf.uint32)
    for column in range(2):
        word = seeds[:, column]
        for half in (tf.bitwise.right_shift(word, tf.constant(32, tf.int64)),
                     tf.bitwise.bitwise_and(word, tf.constant(0xFFFFFFFF, tf.int64))):
            key = lowbias32(tf.bitwise.bitwise_xor(key, lowbias32(tf.cast(half, tf.uint32))))
    return key


def hashed_uniforms(keys: tf.Tensor, count: int) -> tf.Tensor:
    """[n, count] floats in (0, 1) from uint32 keys [n], a hash of (key, counter): 24 random bits each, never 0."""
    spread = (np.arange(count, dtype=np.uint64) * 0x9E3779B9 + 1) % (1 << 32)  # Distinct counters over 32 bits.
    counters = lowbias32(tf.constant(spread.astype(np.uint32)))
    bits = lowbias32(tf.bitwise.bitwise_xor(tf.cast(keys, tf.uint32)[:, tf.newaxis], counters[tf.newaxis]))
    return (tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), tf.float32) + 0.5) * _UNIFORM_SCALE


def _xor(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    return tf.bitwise.bitwise_xor(a, b)


def keys_from_positions(seed: int, positions: tf.Tensor) -> tf.Tensor:
    """Per-example uint32 keys from the run's SEED and each example's int64 training-stream position."""
    positions = tf.cast(positions, tf.int64)
    high = tf.cast(tf.bitwise.right_shift(positions, tf.constant(32, tf.int64)), tf.uint32)
    low = tf.cast(tf.bitwise.bitwise_and(positions, tf.constant(0xFFFFFFFF, tf.int64)), tf.uint32)
    seed_key = lowbias32(_xor(tf.constant(seed & 0xFFFFFFFF, tf.uint32), lowbias32(tf.constant(seed >> 32, tf.uint32))))
    return lowbias32(_xor(lowbias32(_xor(seed_key, high)), low))
