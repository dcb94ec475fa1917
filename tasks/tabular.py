"""Tabular tasks: a vector of numeric features -> a class (TabularClassification) or a number (TabularRegression).

The features are standardised with the mean and standard deviation of the train split, computed once when the task
is bound to the prepared dataset (float64, over every train example: the same numbers on every host and on resume)
and baked into the exported model, which serves the raw feature vectors as the dataset stores them.
"""

import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tasks.base import ClassificationTask, RegressionTask, Task, classification_outputs, label_names


@dataclasses.dataclass(frozen=True)
class _Tabular(Task):
    num_features: int = 0
    features_key: str = "features"
    train_split: str = "train"  # Where the standardisation statistics come from.
    mean: tuple[float, ...] | None = None  # None until bind(); or set them to fix the statistics by hand.
    std: tuple[float, ...] | None = None
    # The names of the vector's columns, in order: the export's metadata lists them, and `python -m tools.predict`
    # reads a CSV's columns by them. None: feature_0, feature_1, ...
    feature_names: tuple[str, ...] | None = None
    # A column of the user's CSV that is not a feature but names its row (python -m stage --id_column): the export's
    # metadata names it, and `python -m tools.predict` keys each prediction by it. None: no id column.
    id_column: str | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return self.features_key, self.label_key

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.num_features,)

    def stored_shapes(self):
        return {self.features_key: (self.num_features,)}

    @property
    def column_names(self) -> tuple[str, ...]:
        """`feature_names`, or feature_0, feature_1, ... when none are given."""
        return self.feature_names or tuple(f"feature_{index}" for index in range(self.num_features))

    def bind(self, builder):
        if self.feature_names is not None and len(self.feature_names) != self.num_features:
            raise ValueError(f"{type(self).__name__} has {len(self.feature_names)} feature_names for "
                             f"num_features={self.num_features}; give one name per feature (or None).")
        if self.mean is not None and self.std is not None:
            return self
        values = tfds.as_numpy(builder.as_dataset(split=self.train_split, batch_size=-1))[self.features_key]
        values = np.asarray(values, np.float64).reshape(len(values), -1)
        std = values.std(axis=0)
        return dataclasses.replace(self, mean=tuple(values.mean(axis=0).tolist()),
                                   std=tuple(np.where(std > 0, std, 1.0).tolist()))  # Constant columns: unscaled.

    def preprocess(self, features: tf.Tensor) -> tf.Tensor:
        """Raw feature vectors ([..., num_features], any numeric dtype) -> standardised float32."""
        if self.mean is None or self.std is None:
            raise ValueError(f"{type(self).__name__} has no feature statistics: call bind(builder) first.")
        features = tf.cast(features, tf.float32)
        # Times the float32 reciprocal, not divided: see ImageClassification.preprocess.
        inverse_std = np.float32(1.0) / np.asarray(self.std, np.float32)
        return (features - tf.constant(self.mean, tf.float32)) * tf.constant(inverse_std)

    def serving_signature(self):
        return {"features": tf.TensorSpec([None, self.num_features], tf.float32, name="features")}

    def finite_features(self, features: tf.Tensor) -> tf.Tensor:
        """The served `features`, after an assertion that every value is finite: a NaN would be answered (every NaN
        row gets the same class) and an infinity gives NaN probabilities, so the request fails instead with an
        InvalidArgumentError that names the example (its row in the batch) and the feature (its column name)."""
        bad = tf.logical_not(tf.math.is_finite(features))
        # The first bad value, in row-major order (a sentinel after the last keeps an all-finite or empty batch valid).
        first = tf.argmax(tf.concat([tf.reshape(bad, [-1]), [True]], axis=0), output_type=tf.int32)
        column = tf.minimum(first % self.num_features, self.num_features - 1)
        value = tf.concat([tf.reshape(features, [-1]), [0.0]], axis=0)[first]
        check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [
            "features: example", first // self.num_features, "(row of the batch), feature",
            tf.gather(tf.constant(list(self.column_names)), column), "is", value,
            ": NaN and infinite values cannot be answered; fill the value in or drop the example."])
        with tf.control_dependencies([check]):
            return tf.identity(features)

    def serving_example(self, example, features):
        return {"features": tf.cast(example[self.features_key], tf.float32)}

    def serving_metadata(self):
        return {**super().serving_metadata(), "feature_names": list(self.column_names), "id_column": self.id_column}


@dataclasses.dataclass(frozen=True)
class TabularClassification(_Tabular, ClassificationTask):
    num_classes: int = 2
    class_names: tuple[str, ...] | None = None

    @property
    def output_size(self) -> int:
        return self.num_classes

    def bind(self, builder):
        return dataclasses.replace(super().bind(builder), class_names=label_names(builder, self.label_key))

    def serving_metadata(self):
        return {**super().serving_metadata(), "class_names": list(self.class_names) if self.class_names else None}

    def prepare(self, example, features, *, seed=None):
        vector = tf.ensure_shape(self.preprocess(example[self.features_key]), (self.num_features,))
        return vector, example[self.label_key]

    def prepare_batch(self, examples, features, *, seeds):
        vectors = tf.ensure_shape(self.preprocess(examples[self.features_key]), (None, self.num_features))
        return vectors, examples[self.label_key]

    def serve(self, model, inputs):
        features = self.preprocess(self.finite_features(inputs["features"]))
        return classification_outputs(model(features, training=False), self.class_names)


@dataclasses.dataclass(frozen=True)
class TabularRegression(_Tabular, RegressionTask):
    """One float target per example; the model outputs one number (its logits layer has 1 unit)."""


    @property
    def output_size(self) -> int:
        return 1

    def prepare(self, example, features, *, seed=None):
        vector = tf.ensure_shape(self.preprocess(example[self.features_key]), (self.num_features,))
        return vector, tf.cast(example[self.label_key], tf.float32)

    def prepare_batch(self, examples, features, *, seeds):
        vectors = tf.ensure_shape(self.preprocess(examples[self.features_key]), (None, self.num_features))
        return vectors, tf.cast(examples[self.label_key], tf.float32)

    def serve(self, model, inputs):
        features = self.preprocess(self.finite_features(inputs["features"]))
        return {"predictions": tf.cast(model(features, training=False)[:, 0], tf.float32)}
