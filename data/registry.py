"""Datasets by name (`DATASET`): which TFDS dataset, which splits, and how its images become model inputs.

To add a dataset: make (or pick) a TFDS builder, then add a `DatasetSpec` to `DATASETS`. The pipeline in
`data/pipeline.py` and the serving signature in `training/export.py` both use `DatasetSpec.preprocess`, so training
and serving see the same inputs.
"""

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from training.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What the input pipeline needs to know about one TFDS image-classification dataset."""

    tfds_name: str
    train_split: str
    eval_split: str
    num_classes: int
    image_shape: tuple[int, int, int]
    max_pixel_value: float  # Raw pixel values are scaled by this to [0, 1] ...
    mean: tuple[float, ...]  # ... then standardised per channel with mean and std.
    std: tuple[float, ...]
    # Optional augmentation (image, stateless seed [2] int32) -> image; must be a pure function of its arguments
    # so the data order and content are the same for a given SEED and step, across replica counts and resumes.
    augment: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None = None
    module: str | None = None  # Module to import so TFDS registers the builder (bundled builders only).

    def preprocess(self, images: tf.Tensor) -> tf.Tensor:
        """Raw images (any int dtype, [..., H, W, C]) -> standardised float32; one image or a batch."""
        images = tf.cast(images, tf.float32) / self.max_pixel_value
        return (images - tf.constant(self.mean, tf.float32)) / tf.constant(self.std, tf.float32)


def _flip_and_crop_32(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """CIFAR-style augmentation: random horizontal flip, 4-pixel pad and random 32x32 crop (stateless)."""
    flip_seed, crop_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    image = tf.pad(image, [[4, 4], [4, 4], [0, 0]], mode="REFLECT")
    return tf.image.stateless_random_crop(image, size=(32, 32, 3), seed=crop_seed)


DATASETS: dict[str, DatasetSpec] = {
    # Bundled, offline: scikit-learn's 8x8 digits (data/digits). 1,437 train / 360 test images.
    "digits": DatasetSpec(tfds_name="sklearn_digits", train_split="train", eval_split="test", num_classes=10,
                          image_shape=(8, 8, 1), max_pixel_value=16.0, mean=(0.3,), std=(0.38,),
                          module="data.digits.digits_dataset_builder"),
    # Downloaded by TFDS where internet exists (60,000 / 10,000 images).
    "mnist": DatasetSpec(tfds_name="mnist", train_split="train", eval_split="test", num_classes=10,
                         image_shape=(28, 28, 1), max_pixel_value=255.0, mean=(0.1307,), std=(0.3081,)),
    # Downloaded by TFDS where internet exists (50,000 / 10,000 images).
    "cifar10": DatasetSpec(tfds_name="cifar10", train_split="train", eval_split="test", num_classes=10,
                           image_shape=(32, 32, 3), max_pixel_value=255.0, mean=(0.4914, 0.4822, 0.4465),
                           std=(0.2470, 0.2435, 0.2616), augment=_flip_and_crop_32),
}


def get_dataset_spec(name: str) -> DatasetSpec:
    """The registered DatasetSpec for `name`; a ConfigError that lists the known names otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ConfigError(f"Unknown DATASET={name!r}. Known datasets: {', '.join(sorted(DATASETS))}. Register a new "
                          "one in data/registry.py.") from None
