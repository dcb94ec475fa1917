"""mixup (Zhang et al. 2018) and CutMix (Yun et al. 2019) in the training step, keyed by example position.

Pairing: the per-replica batch's rows 2k and 2k + 1 are mixed with each other. Every per-replica batch (and every
micro-batch of ACCUMULATE_STEPS) is a contiguous block of the training stream starting at an even position, because
step s, replica r takes positions [s G + r b, s G + (r + 1) b) (data/pipeline.py, data/device_split.py) with G and the
per-replica batch b even (required: tasks/augmentation/by_name.py refuses an odd one). So on one host the partner of
stream position p is p XOR 1, whatever the replica count, and after a resume. (With P input pipelines, i.e. hosts,
each pipeline strides the stream by P, so the partner is p +- P: fixed for a host count, like shard_stream's order.)

Each pair draws lambda ~ Beta(alpha, alpha) from its key (SEED and the pair's first position: models/layers.py's
hash), as X / (X + Y) with X, Y ~ Gamma(alpha) by Marsaglia and Tsang's method on hashed uniforms: no
stateful op and no StatelessRandomGamma (which has no XLA kernel), so it runs on TPUs. lambda is folded to
max(lambda, 1 - lambda): the pair's two mixed images are exactly standard mixup's, and each row keeps the larger share
of its own example, so its own label is the dominant one (the training accuracy is against it).

mixup: x = lambda x_own + (1 - lambda) x_partner. CutMix: a box of area ~ (1 - lambda) of the image, centred
uniformly and clipped at the borders, is shared by the pair; each row takes the partner's pixels on the smaller side
of the box edge (inside it, or outside when the clipped box covers over half), and the label weights are the actual
areas. Targets become soft: w_own one_hot(own) + w_partner one_hot(partner) (the loss takes soft targets:
training/learning/losses.py). Evaluation never mixes.

Both (experiment.augmentation=[..., 'mixup', 'cutmix']): each global batch is mixed by one of them, CutMix with
probability `cutmix_probability`, as timm's and DeiT's recipes switch (their switch_prob 0.5). The draw is a hash of
(SEED, the step), the step being the batch's first position // GLOBAL_BATCH_SIZE (step s holds positions
[s G, (s + 1) G) on any host, replica or micro-batch): every replica and micro-batch of a step makes the same choice,
at any replica count and after a resume.
"""

import dataclasses

import gin
import tensorflow as tf

from common.errors import ConfigError
from common.keyed_random import hashed_uniforms, keys_from_positions

SALT = 0x6D6978 << 32  # Added to SEED for the pair keys: independent of the dropout and augmentation draws.
SWITCH_SALT = 0x737769 << 32  # Added to SEED for the per-step choice between mixup and CutMix.
CANDIDATES = 12  # Marsaglia-Tsang proposals per gamma draw; each is accepted with probability > 0.95.


def log_gamma_sample(draws: tf.Tensor, alpha: float) -> tf.Tensor:
    """log of one Gamma(alpha, 1) sample per row of `draws` [n, 3 * CANDIDATES + 1] uniforms (Marsaglia and Tsang
    2000 on Gamma(alpha + 1) when alpha < 1, boosted by U^(1 / alpha); in logs, so a tiny alpha cannot underflow)."""
    shape = alpha + 1.0 if alpha < 1.0 else alpha
    d = shape - 1.0 / 3.0
    c = 1.0 / (9.0 * d) ** 0.5
    first, second, accept = (draws[:, index * CANDIDATES:(index + 1) * CANDIDATES] for index in range(3))
    normal = tf.sqrt(-2.0 * tf.math.log(first)) * tf.cos(2.0 * 3.141592653589793 * second)  # Box-Muller.
    v = (1.0 + c * normal) ** 3
    safe_v = tf.where(v > 0, v, 1.0)
    accepted = (v > 0) & (tf.math.log(accept) < 0.5 * normal ** 2 + d - d * safe_v + d * tf.math.log(safe_v))
    first_accepted = tf.argmax(tf.cast(accepted, tf.int32), axis=1)  # 0 if none (probability < 1e-15): v = 1.
    log_sample = tf.math.log(d) + tf.math.log(tf.gather(safe_v, first_accepted, batch_dims=1))
    if alpha < 1.0:
        log_sample += tf.math.log(draws[:, 3 * CANDIDATES]) * (1.0 / alpha)
    return log_sample


def beta_draws(keys: tf.Tensor, alpha: float) -> tf.Tensor:
    """lambda ~ Beta(alpha, alpha) per key [n], float32, from two Gamma(alpha) samples of the key's uniforms.

    One pair at a time (map_fn): CPU kernels compute log, cos and exp of a tensor's elements in SIMD packets and of
    the remainder one by one, and the two round differently, so a pair's lambda would depend on how many pairs its
    batch holds, i.e. on the replica count. At one shape per pair it cannot."""
    width = 3 * CANDIDATES + 1

    def one_pair(key):
        draws = hashed_uniforms(key[tf.newaxis], 2 * width)
        return tf.sigmoid(log_gamma_sample(draws[:, :width], alpha) - log_gamma_sample(draws[:, width:], alpha))[0]

    return tf.map_fn(one_pair, keys, fn_output_signature=tf.float32)


def pair_keys(seed: int, positions: tf.Tensor) -> tf.Tensor:
    """The uint32 key of each pair (rows 2k, 2k + 1) of a batch's positions: a hash of SEED and row 2k's position."""
    return keys_from_positions(seed + SALT, tf.reshape(positions, [-1, 2])[:, 0])


def partners(tensor: tf.Tensor) -> tf.Tensor:
    """Rows 2k and 2k + 1 swapped: each row's partner."""
    pairs = tf.reshape(tensor, [-1, 2, *tensor.shape[1:]])
    return tf.reshape(tf.reverse(pairs, axis=[1]), tf.shape(tensor))


def _per_row(pair_values: tf.Tensor) -> tf.Tensor:
    return tf.repeat(pair_values, 2, axis=0)


@dataclasses.dataclass(frozen=True)
class Mixing:
    """One of 'mixup', 'cutmix' with its Beta(alpha, alpha); called in the step with the run's SEED and classes."""

    kind: str
    alpha: float

    def __call__(self, images: tf.Tensor, labels: tf.Tensor, positions: tf.Tensor, *, seed: int,
                 num_classes: int, global_batch_size: int | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """(images [b, H, W, C], int labels [b], positions [b]) -> (mixed images, soft targets [b, classes]).
        `global_batch_size` is for MixupOrCutmix's choice per step; one kind mixes every batch alike."""
        del global_batch_size
        keys = pair_keys(seed, positions)
        lam = beta_draws(keys, self.alpha)
        other = partners(images)
        if self.kind == "mixup":
            own = tf.maximum(lam, 1.0 - lam)
            weight = tf.reshape(_per_row(own), [-1] + [1] * (images.shape.rank - 1))
            mixed = tf.cast(weight, images.dtype) * images + tf.cast(1.0 - weight, images.dtype) * other
        else:
            region, own = self.cut(keys, lam, images.shape[1], images.shape[2])
            mixed = tf.where(_per_row(region)[..., tf.newaxis], other, images)
        own = _per_row(own)[:, tf.newaxis]
        one_hot = tf.one_hot(labels, num_classes, dtype=tf.float32)
        return mixed, own * one_hot + (1.0 - own) * partners(one_hot)

    @staticmethod
    def cut(keys: tf.Tensor, lam: tf.Tensor, height: int, width: int) -> tuple[tf.Tensor, tf.Tensor]:
        """Per pair: the [H, W] region taking the partner's pixels, and the own share of the pixels."""
        centre = hashed_uniforms(tf.bitwise.bitwise_xor(tf.cast(keys, tf.uint32), tf.constant(0xC0FFEE, tf.uint32)), 2)
        side = tf.sqrt(1.0 - lam)
        half_height, half_width = tf.floor(side * (height * 0.5)), tf.floor(side * (width * 0.5))
        centre_y, centre_x = tf.floor(centre[:, 0] * height), tf.floor(centre[:, 1] * width)
        top, bottom = tf.maximum(centre_y - half_height, 0.0), tf.minimum(centre_y + half_height, float(height))
        left, right = tf.maximum(centre_x - half_width, 0.0), tf.minimum(centre_x + half_width, float(width))
        rows = tf.range(height, dtype=tf.float32)[tf.newaxis, :, tf.newaxis]
        columns = tf.range(width, dtype=tf.float32)[tf.newaxis, tf.newaxis, :]
        box = ((rows >= top[:, None, None]) & (rows < bottom[:, None, None])
               & (columns >= left[:, None, None]) & (columns < right[:, None, None]))
        area = (bottom - top) * (right - left) * (1.0 / (height * width))  # No division: see randaugment.py.
        larger = area > 0.5
        region = tf.math.logical_xor(box, larger[:, None, None])
        return region, tf.maximum(area, 1.0 - area)


@dataclasses.dataclass(frozen=True)
class MixupOrCutmix:
    """mixup or CutMix per global batch: CutMix with probability `cutmix_probability` (module docstring)."""

    mixup: Mixing
    cutmix: Mixing
    cutmix_probability: float

    def __call__(self, images: tf.Tensor, labels: tf.Tensor, positions: tf.Tensor, *, seed: int, num_classes: int,
                 global_batch_size: int) -> tuple[tf.Tensor, tf.Tensor]:
        """As Mixing's, by the kind drawn for this batch's step."""
        arguments = dict(seed=seed, num_classes=num_classes)
        return tf.cond(self.cutmix_drawn(positions, seed=seed, global_batch_size=global_batch_size),
                       lambda: self.cutmix(images, labels, positions, **arguments),
                       lambda: self.mixup(images, labels, positions, **arguments))

    def cutmix_drawn(self, positions: tf.Tensor, *, seed: int, global_batch_size: int) -> tf.Tensor:
        """Whether the step of these `positions` (any part of its global batch) is mixed by CutMix: a bool []."""
        step = tf.cast(positions[0], tf.int64) // global_batch_size
        draw = hashed_uniforms(keys_from_positions(seed + SWITCH_SALT, step[tf.newaxis]), 1)[0, 0]
        return draw < self.cutmix_probability


def _checked_alpha(name: str, alpha) -> float:
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0.01 <= alpha <= 100:
        raise ConfigError(f"{name}.alpha={alpha!r} must be a number in [0.01, 100] (lambda ~ Beta(alpha, alpha)); "
                          f"e.g. --gin_param={name}.alpha={0.2 if name == 'mixup' else 1.0}.")
    return float(alpha)


@gin.configurable
def mixup(alpha: float = 0.2) -> Mixing:
    """mixup with lambda ~ Beta(alpha, alpha); 0.2 is the paper's ImageNet setting (Zhang et al. 2018)."""
    return Mixing("mixup", _checked_alpha("mixup", alpha))


@gin.configurable
def cutmix(alpha: float = 1.0) -> Mixing:
    """CutMix with lambda ~ Beta(alpha, alpha); 1.0 (uniform) is the paper's setting (Yun et al. 2019)."""
    return Mixing("cutmix", _checked_alpha("cutmix", alpha))


@gin.configurable
def mixup_or_cutmix(cutmix_probability: float = 0.5) -> MixupOrCutmix:
    """mixup (mixup.alpha) or CutMix (cutmix.alpha) per batch, CutMix with `cutmix_probability`; 0.5 as in timm and
    DeiT (switch_prob)."""
    if not isinstance(cutmix_probability, (int, float)) or isinstance(cutmix_probability, bool) \
            or not 0 <= cutmix_probability <= 1:
        raise ConfigError(f"mixup_or_cutmix.cutmix_probability={cutmix_probability!r} must be a number in [0, 1] (the "
                          "share of batches CutMix mixes; mixup the others); e.g. "
                          "--gin_param=mixup_or_cutmix.cutmix_probability=0.5.")
    return MixupOrCutmix(mixup(), cutmix(), float(cutmix_probability))
