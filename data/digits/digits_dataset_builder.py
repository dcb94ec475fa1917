"""TFDS builder for scikit-learn's 8x8 handwritten digits: real data that needs no download.

It is also the worked example of adding your own dataset: subclass `tfds.core.GeneratorBasedBuilder`, describe the
features in `_info`, yield `(key, example)` pairs per split, and register a `DatasetSpec` for it in
`data/registry.py`. Build it with `tfds.builder('sklearn_digits', data_dir=...).download_and_prepare()` (the
pipeline does this on first use); the build is offline because the images ship inside the scikit-learn wheel.

The split is fixed and documented: of the 1,797 images (in scikit-learn's order), every fifth one (index % 5 == 0)
is 'test' (360 images) and the other 1,437 are 'train'. Pixel values are ints 0..16, stored as uint8.
"""

import numpy as np
import tensorflow_datasets as tfds

TEST_EVERY = 5  # Index % TEST_EVERY == 0 goes to the test split.


def split_examples(is_test: bool):
    """(index, image uint8 [8, 8, 1], label) of the fixed split's 'test' (is_test) or 'train' images, in
    scikit-learn's order; shared with the fine-tune example's halves (digit_halves_builder.py)."""
    from sklearn.datasets import load_digits  # Imported here: only a build needs scikit-learn.

    digits = load_digits()
    images = digits.images.astype(np.uint8)[..., np.newaxis]
    for index, (image, label) in enumerate(zip(images, digits.target, strict=True)):
        if (index % TEST_EVERY == 0) == is_test:
            yield index, image, int(label)


class SklearnDigits(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's `load_digits()` (UCI optical recognition of handwritten digits, 8x8, 10 classes)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: fixed split, test = index % 5 == 0."}

    def _info(self) -> tfds.core.DatasetInfo:
        # DatasetInfo is built directly: TFDS's `dataset_info_from_configs` needs package metadata this repo lacks.
        return tfds.core.DatasetInfo(
            builder=self,
            description="scikit-learn's 8x8 handwritten digits; pixels 0..16; test = every fifth image.",
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 1), dtype=np.uint8),
                "label": tfds.features.ClassLabel(num_classes=10),
            }),
            supervised_keys=("image", "label"),
            homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html#digits-dataset",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # Nothing to download: the data ships with scikit-learn.
        return {"train": self._generate_examples(is_test=False), "test": self._generate_examples(is_test=True)}

    def _generate_examples(self, is_test: bool):
        for index, image, label in split_examples(is_test):
            yield index, {"image": image, "label": label}
