"""TFDS builders for two offline tabular datasets: the worked examples of the tabular tasks (tasks/tabular.py).

- `sklearn_breast_cancer`: scikit-learn's bundled Wisconsin breast cancer data (569 rows, 30 float features, classes
  malignant/benign); test = every fifth row (114), train = the other 455.
- `synthetic_housing`: a regression set generated here (5,000 rows, 8 float features on very different scales, one
  float target, a fixed NumPy seed): y = 2 x0 - x1 + 0.5 x2 x3 + sin(3 x4) + 0.3 x5^2 + 0.1 noise, with x the
  features standardised (x6 and x7 are distractors). Test = every fifth row (1,000), train = 4,000.
Both build offline in a second; like data/digits, they show how to wrap data you have in a TFDS builder (for files
you already have, `python -m stage` does it without code).
"""

import numpy as np
import tensorflow_datasets as tfds

TEST_EVERY = 5  # Row index % TEST_EVERY == 0 goes to the test split.


class SklearnBreastCancer(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's `load_breast_cancer()`: 30 features of cell nuclei, malignant (0) or benign (1)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: fixed split, test = index % 5 == 0."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Wisconsin diagnostic breast cancer (scikit-learn); test = every fifth row.",
            features=tfds.features.FeaturesDict({
                "features": tfds.features.Tensor(shape=(30,), dtype=np.float32),
                "label": tfds.features.ClassLabel(names=["malignant", "benign"]),
            }),
            supervised_keys=("features", "label"),
            homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html#breast-cancer-dataset",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # Nothing to download: the data ship with scikit-learn.
        return {"train": self._generate_examples(is_test=False), "test": self._generate_examples(is_test=True)}

    def _generate_examples(self, is_test: bool):
        from sklearn.datasets import load_breast_cancer

        data = load_breast_cancer()
        for index, (row, label) in enumerate(zip(data.data.astype(np.float32), data.target, strict=True)):
            if (index % TEST_EVERY == 0) == is_test:
                yield index, {"features": row, "label": int(label)}


class SyntheticHousing(tfds.core.GeneratorBasedBuilder):
    """A generated regression set (see the module docstring): 8 features, one target."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: NumPy seed 0, 5,000 rows, test = index % 5 == 0."}
    SCALES = np.array([1.0, 10.0, 100.0, 0.1, 5.0, 1000.0, 2.0, 0.01])
    OFFSETS = np.array([0.0, 50.0, -300.0, 1.0, 0.0, 2000.0, -4.0, 0.5])

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Generated regression data: 8 features on different scales, one target.",
            features=tfds.features.FeaturesDict({
                "features": tfds.features.Tensor(shape=(8,), dtype=np.float32),
                "target": tfds.features.Scalar(dtype=np.float32),
            }),
            supervised_keys=("features", "target"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {"train": self._generate_examples(is_test=False), "test": self._generate_examples(is_test=True)}

    def _generate_examples(self, is_test: bool):
        rng = np.random.RandomState(0)
        x = rng.standard_normal((5000, 8))
        y = 2 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] * x[:, 3] + np.sin(3 * x[:, 4]) + 0.3 * x[:, 5] ** 2
        y += 0.1 * rng.standard_normal(5000)
        features = (x * self.SCALES + self.OFFSETS).astype(np.float32)
        for index in range(5000):
            if (index % TEST_EVERY == 0) == is_test:
                yield index, {"features": features[index], "target": np.float32(y[index])}
