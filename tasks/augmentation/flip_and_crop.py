"""'flip_and_crop': CIFAR-10's augmentation at any image size (its default training augmentation, and
experiment.augmentation's 'flip_and_crop').

Its three draws (flip or not, the crop's two offsets) are a hash of the example's seed (common/keyed_random.py), not
tf.random's stateless ops, which pick another generator under XLA: the batches a TPU draws in its compiled loop from
the split in its memory (data/device_split.py) are then the host pipeline's, bit for bit.
"""

import tensorflow as tf

from common.keyed_random import hashed_uniforms, seed_keys


def flip_and_crop(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """CIFAR-style augmentation at any size: random horizontal flip, reflect padding of side // 8 (at least 1; 4 for
    CIFAR's 32) and a random crop back to the image's size (stateless: a function of `seed`, int [2])."""
    height, width, channels = image.shape
    pad_y, pad_x = max(1, height // 8), max(1, width // 8)
    flip, along_y, along_x = tf.unstack(hashed_uniforms(seed_keys(seed[tf.newaxis]), 3)[0])
    image = tf.where(flip < 0.5, tf.reverse(image, [1]), image)
    image = tf.pad(image, [[pad_y, pad_y], [pad_x, pad_x], [0, 0]], mode="REFLECT")
    # Offsets uniform over the 2 pad + 1 places (the draws are in (0, 1), never 1).
    offset_y = tf.cast(along_y * (2 * pad_y + 1), tf.int32)
    offset_x = tf.cast(along_x * (2 * pad_x + 1), tf.int32)
    return tf.slice(image, tf.stack([offset_y, offset_x, 0]), [height, width, channels])
