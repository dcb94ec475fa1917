"""RandAugment (Cubuk et al. 2020, "RandAugment: Practical automated data augmentation with a reduced search space"),
a documented subset, per example and stateless: a pure function of (image, seed), the seed being (SEED, the example's
training-stream position), so an example's draws are the same at any replica count and after a resume.

Each of `num_layers` layers picks one op uniformly from OPS and applies it at the fixed `magnitude` (0..10, the
scale of the paper's reference code, tensorflow/tpu autoaugment.py: level = magnitude / 10) with a random sign where
the op has one. The ops work on pixels in [0, 1] with any number of channels and keep the image's static shape, and
every one lowers to XLA (no ImageProjectiveTransform, which has no XLA kernel: the geometric ops sample with
nearest-neighbour gathers; no histograms):

  identity; auto_contrast (per-channel min/max stretch); brightness and contrast (factor 1 +- 0.9 level, clipped);
  solarize (pixels above 1 - level inverted: stronger with the level, as in timm); posterize (8 - round(4 level)
  bits); rotate (+-30 level degrees); shear_x, shear_y (+-0.3 level); translate_x, translate_y (+-0.45 level of the
  side). Uncovered pixels are filled with 0.5 grey.

Left out of the paper's 14: equalize (a per-image histogram), color (needs 3 channels) and sharpness.
"""

import dataclasses
import math

import gin
import numpy as np
import tensorflow as tf

from common.errors import ConfigError
from common.keyed_random import hashed_uniforms, seed_keys

MAX_MAGNITUDE = 10.0
_INVERSE_255 = np.float32(1.0 / 255.0)
FILL = 0.5  # Grey, for pixels a geometric op uncovers (the reference code's 128 of 255).


def _identity(image, level, sign):
    del level, sign
    return image


def _auto_contrast(image, level, sign):
    del level, sign
    low = tf.reduce_min(image, axis=[0, 1], keepdims=True)
    high = tf.reduce_max(image, axis=[0, 1], keepdims=True)
    spread = high - low
    return tf.where(spread > 0, (image - low) / tf.where(spread > 0, spread, 1.0), image)


def _brightness(image, level, sign):
    return tf.clip_by_value(image * (1.0 + sign * 0.9 * level), 0.0, 1.0)


def _contrast(image, level, sign):
    mean = tf.reduce_mean(image)
    return tf.clip_by_value(mean + (image - mean) * (1.0 + sign * 0.9 * level), 0.0, 1.0)


def _solarize(image, level, sign):
    del sign
    return tf.where(image > 1.0 - level, 1.0 - image, image)


def _posterize(image, level, sign):
    del sign
    dropped_bits = tf.round(4.0 * level)  # 8 - dropped bits are kept.
    # Multiplications only (powers of two: exact): Grappler turns a division by a constant into a multiplication in
    # some graphs and not others, which would make the pixels differ by a rounding between replica counts.
    kept = tf.floor(tf.round(image * 255.0) * tf.pow(2.0, -dropped_bits)) * tf.pow(2.0, dropped_bits)
    return kept * _INVERSE_255


def _sample(image, source_x, source_y):
    """The image at source pixel coordinates (nearest neighbour); FILL where they fall outside."""
    height, width = image.shape[0], image.shape[1]
    column, row = tf.cast(tf.round(source_x), tf.int32), tf.cast(tf.round(source_y), tf.int32)
    inside = (column >= 0) & (column < width) & (row >= 0) & (row < height)
    indices = tf.stack([tf.clip_by_value(row, 0, height - 1), tf.clip_by_value(column, 0, width - 1)], axis=-1)
    return tf.where(inside[..., tf.newaxis], tf.gather_nd(image, indices), FILL)


def _affine(image, xx, xy, yx, yy, shift_x, shift_y):
    """Output pixel (x, y), centred, reads input (xx x + xy y + shift_x, yx x + yy y + shift_y), centred."""
    height, width = image.shape[0], image.shape[1]
    centre_y, centre_x = (height - 1) / 2.0, (width - 1) / 2.0
    y, x = tf.meshgrid(tf.range(height, dtype=tf.float32) - centre_y, tf.range(width, dtype=tf.float32) - centre_x,
                       indexing="ij")
    return _sample(image, xx * x + xy * y + shift_x + centre_x, yx * x + yy * y + shift_y + centre_y)


def _rotate(image, level, sign):
    angle = sign * level * (30.0 * math.pi / 180.0)
    cos, sin = tf.cos(angle), tf.sin(angle)
    return _affine(image, cos, sin, -sin, cos, 0.0, 0.0)  # Input = R(-angle) output.


def _shear_x(image, level, sign):
    return _affine(image, 1.0, sign * 0.3 * level, 0.0, 1.0, 0.0, 0.0)


def _shear_y(image, level, sign):
    return _affine(image, 1.0, 0.0, sign * 0.3 * level, 1.0, 0.0, 0.0)


def _translate_x(image, level, sign):
    return _affine(image, 1.0, 0.0, 0.0, 1.0, -sign * 0.45 * level * image.shape[1], 0.0)


def _translate_y(image, level, sign):
    return _affine(image, 1.0, 0.0, 0.0, 1.0, 0.0, -sign * 0.45 * level * image.shape[0])


OPS = {"identity": _identity, "auto_contrast": _auto_contrast, "brightness": _brightness, "contrast": _contrast,
       "solarize": _solarize, "posterize": _posterize, "rotate": _rotate, "shear_x": _shear_x, "shear_y": _shear_y,
       "translate_x": _translate_x, "translate_y": _translate_y}


def _branch(op, image, level, sign):
    """A switch_case branch applying `op`; every branch returns the input's static shape."""
    return lambda: tf.ensure_shape(op(image, level, sign), image.shape)


@dataclasses.dataclass(frozen=True)
class RandAugment:
    """`num_layers` ops drawn per example from OPS, each at `magnitude` (0..10); on [0, 1] pixels."""

    num_layers: int = 2
    magnitude: float = 9.0

    def __call__(self, image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """One image [H, W, C] in [0, 1] with its stateless seed [2] -> the augmented image, same shape."""
        level = tf.constant(self.magnitude / MAX_MAGNITUDE, tf.float32)
        branches = list(OPS.values())
        for index, sign in self.layer_draws(seed):
            image = tf.switch_case(index, [_branch(op, image, level, sign) for op in branches])
        return image

    def layer_draws(self, seed: tf.Tensor) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """(OPS index, sign) per layer, from a hash of `seed` (models/layers.py): integer ops, so the same draws with
        and without XLA, on CPUs, GPUs and TPUs (tf.random's stateless ops pick another generator under XLA)."""
        uniform = hashed_uniforms(seed_keys(seed[tf.newaxis]), 2 * self.num_layers)[0]
        return [(tf.minimum(tf.cast(uniform[2 * layer] * len(OPS), tf.int32), len(OPS) - 1),
                 tf.where(uniform[2 * layer + 1] < 0.5, -1.0, 1.0)) for layer in range(self.num_layers)]

    def op_indices(self, seed: tf.Tensor) -> tf.Tensor:
        """The OPS indices drawn for `seed`, one per layer (what the tests compare)."""
        return tf.stack([index for index, _ in self.layer_draws(seed)])


@gin.configurable
def randaugment(num_layers: int = 2, magnitude: float = 9.0) -> RandAugment:
    """The RandAugment of `experiment.augmentation=['randaugment']`, with its gin-bound settings checked."""
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or not 1 <= num_layers <= 10:
        raise ConfigError(f"randaugment.num_layers={num_layers!r} must be an integer in 1..10 (ops per image; the "
                          "paper uses 1-3); e.g. --gin_param=randaugment.num_layers=2.")
    if not isinstance(magnitude, (int, float)) or isinstance(magnitude, bool) or \
            not 0 <= magnitude <= MAX_MAGNITUDE:
        raise ConfigError(f"randaugment.magnitude={magnitude!r} must be a number in 0..10 (the strength of every "
                          "op); e.g. --gin_param=randaugment.magnitude=9.")
    return RandAugment(num_layers=num_layers, magnitude=float(magnitude))
