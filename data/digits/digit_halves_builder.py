"""TFDS builder of the two halves of the bundled digits for the fine-tune example (docs/make_it_yours.md): digits
0-4 with every label, to pretrain on, and digits 5-9 with a few labels, to fine-tune on. Offline, like data/digits.

Both come from the same fixed split as `sklearn_digits` (data/digits/digits_dataset_builder.py: test = every fifth
image of scikit-learn's order), so no test image of either half is ever trained on:
- `sklearn_digit_halves/digits_0_4`: the train and test images of 0-4 (719 / 182), labels 0-4;
- `sklearn_digit_halves/digits_5_9_few`: of 5-9, the first LABELS_PER_CLASS train images of each digit in
  scikit-learn's order (50) and every test image (178); labels 0-4, named '5'..'9' (a new 5-way head).
The few-labels subset is a deterministic function of the data: the same 50 images on every machine.
"""

import numpy as np
import tensorflow_datasets as tfds

from data.digits.digits_dataset_builder import split_examples

LABELS_PER_CLASS = 10  # Train images per digit in digits_5_9_few.


class SklearnDigitHalves(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's digits split into 0-4 (all labels) and 5-9 (LABELS_PER_CLASS train labels per digit)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: the sklearn_digits split, halves 0-4 and 5-9 (few train labels)."}
    BUILDER_CONFIGS = [
        tfds.core.BuilderConfig(name="digits_0_4", description="Digits 0-4, every train and test image."),
        tfds.core.BuilderConfig(name="digits_5_9_few",
                                description=f"Digits 5-9 as classes 0-4: {LABELS_PER_CLASS} train images per digit, "
                                            "every test image."),
    ]

    def _digits(self) -> tuple[int, ...]:
        return (0, 1, 2, 3, 4) if self.builder_config.name == "digits_0_4" else (5, 6, 7, 8, 9)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.builder_config.description,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 1), dtype=np.uint8),
                "label": tfds.features.ClassLabel(names=[str(digit) for digit in self._digits()]),
            }),
            supervised_keys=("image", "label"),
            homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html#digits-dataset",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # Nothing to download: the data ships with scikit-learn.
        return {"train": self._generate_examples(is_test=False), "test": self._generate_examples(is_test=True)}

    def _generate_examples(self, is_test: bool):
        first, kept = self._digits()[0], {digit: 0 for digit in self._digits()}
        few = not is_test and self.builder_config.name == "digits_5_9_few"
        for index, image, label in split_examples(is_test):
            if label not in kept or (few and kept[label] == LABELS_PER_CLASS):
                continue
            kept[label] += 1
            yield index, {"image": image, "label": label - first}
