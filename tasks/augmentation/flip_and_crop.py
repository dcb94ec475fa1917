"""'flip_and_crop': CIFAR-10's augmentation at any image size (its default training augmentation, and
experiment.augmentation's 'flip_and_crop')."""

import tensorflow as tf


def flip_and_crop(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """CIFAR-style augmentation at any size: random horizontal flip, reflect padding of side // 8 (at least 1; 4 for
    CIFAR's 32) and a random crop back to the image's size (stateless: a function of `seed`)."""
    height, width, channels = image.shape
    flip_seed, crop_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    pad_y, pad_x = max(1, height // 8), max(1, width // 8)
    image = tf.pad(image, [[pad_y, pad_y], [pad_x, pad_x], [0, 0]], mode="REFLECT")
    return tf.image.stateless_random_crop(image, size=(height, width, channels), seed=crop_seed)
