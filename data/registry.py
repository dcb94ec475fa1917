"""Datasets by name (`DATASET`): which TFDS dataset, which splits, and how its images become model inputs.

To add a dataset: make (or pick) a TFDS builder, then add a `DatasetSpec` to `DATASETS`. The pipeline in
`data/pipeline.py` and the serving signature in `training/export.py` both use `DatasetSpec.preprocess`, so training
and serving see the same inputs.
"""

import dataclasses
from collections.abc import Callable

import tensorflow as tf
import tensorflow_datasets as tfds

from data import imagenet
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
    # Optional decoders from the encoded image (e.g. JPEG bytes) straight to `image_shape` raw pixels, for datasets
    # whose images vary in size: (encoded, stateless seed) -> image for training, (encoded) -> image for eval.
    # None: TFDS's own decoding (the stored images already have `image_shape`). A spec with both a train_decoder
    # and augment gets the same seed in both: derive independent ones with stateless_split.
    train_decoder: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None = None
    eval_decoder: Callable[[tf.Tensor], tf.Tensor] | None = None
    # Train order: None = in host memory when the encoded split is under 1 GiB, else read by shard file
    # (data/shard_stream.py); True/False force one. Large datasets should say True.
    read_by_shard: bool | None = None

    def preprocess(self, images: tf.Tensor) -> tf.Tensor:
        """Raw images (any int dtype, [..., H, W, C]) -> standardised float32; one image or a batch."""
        images = tf.cast(images, tf.float32) / self.max_pixel_value
        return (images - tf.constant(self.mean, tf.float32)) / tf.constant(self.std, tf.float32)

    def model_input(self, encoded: tf.Tensor, image_feature: tfds.features.Image, *,
                    seed: tf.Tensor | None = None) -> tf.Tensor:
        """One encoded image -> the model's input: decoded, preprocessed, and for training (`seed` given)
        augmented; always exactly `image_shape` (static shapes: TPUs need them)."""
        if seed is not None and self.train_decoder is not None:
            image = self.train_decoder(encoded, seed)
        elif self.eval_decoder is not None:
            image = self.eval_decoder(encoded)
        else:
            image = image_feature.decode_example(encoded)
        image = self.preprocess(image)
        if seed is not None and self.augment is not None:
            image = self.augment(image, seed)
        return tf.ensure_shape(image, self.image_shape)


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
    # ILSVRC 2012 (1,281,167 train / 50,000 validation images, 1,000 classes): no download exists; stage it from the
    # two tar files of image-net.org with `python -m data.stage --dataset=imagenet2012 --manual_dir=...`. Read by
    # shard file (~140 GB); JPEGs decoded to 224 x 224 crops (data/imagenet.py). Serving takes 224 x 224 images.
    "imagenet2012": DatasetSpec(tfds_name="imagenet2012", train_split="train", eval_split="validation",
                                num_classes=1000, image_shape=(imagenet.IMAGE_SIZE, imagenet.IMAGE_SIZE, 3),
                                max_pixel_value=255.0, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                                train_decoder=imagenet.train_decoder, eval_decoder=imagenet.eval_decoder,
                                read_by_shard=True),
}


def get_dataset_spec(name: str) -> DatasetSpec:
    """The registered DatasetSpec for `name`; a ConfigError that lists the known names otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ConfigError(f"Unknown DATASET={name!r}. Known datasets: {', '.join(sorted(DATASETS))}. Register a new "
                          "one in data/registry.py.") from None
