"""The task seam: what is learned from a dataset's examples, in one object a forker edits.

A Task says
- which features of a TFDS example it reads (`keys`), and which to keep encoded in memory (`decoders`: by default
  every feature is decoded once when the split is read; images with their own decoder, such as ImageNet's
  JPEGs, stay compressed until an example is drawn);
- how one example becomes (model input, target): `prepare(example, features, seed=...)`; `seed` is given for
  training examples only (stateless augmentation, a pure function of SEED and the example's position);
- the model's input shape and output size, the per-example loss and the metrics it reports by default;
- what the exported model serves: `serving_signature` (the raw features as the dataset stores them) and `serve`
  (the same preprocessing as training, then the model, then named outputs such as class names); `serving_example`
  turns a stored example into what a client sends (the export's warmup and example requests), and
  `serving_metadata` says what a reader of the export needs to know (class names, feature names: serving/).
The input pipelines (data/pipeline.py, data/shard_stream.py), the training step and the export call only these.
`bind(builder)` returns the task completed from the prepared dataset (class names, or statistics computed from the
train split) before anything is built.
"""

import dataclasses

import tensorflow as tf
import tensorflow_datasets as tfds


@dataclasses.dataclass(frozen=True)
class Task:
    """Base class: subclasses are frozen dataclasses whose fields are the task's settings."""

    label_key: str = "label"
    # What a kind of task has in common is set by its base class (ClassificationTask, RegressionTask below): its
    # kind (what losses and metrics check they fit), the per-example loss by name (training/learning/losses.py) and
    # the metrics by name (training/learning/metrics.py) used when the config names none. A new kind of task is one
    # more such base class.
    kind = ""
    default_loss = ""
    default_metrics = ()
    # The training augmentations (tasks/augmentation/, by name) this kind of task takes: experiment.augmentation is
    # checked against it before the dataset is prepared. () = none.
    augmentations = ()

    @property
    def keys(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def input_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def output_size(self) -> int:
        raise NotImplementedError

    def model_options(self) -> dict:
        """Keyword arguments the task adds to the model builder's call (e.g. a text task's vocabulary size)."""
        return {}

    def stored_data_problem(self, features: tfds.features.FeaturesDict, tfds_name: str) -> str | None:
        """What in the dataset's metadata contradicts this task's settings (e.g. its number of classes), as a
        phrase for the error data/registry.py bind_task raises before anything is built; None = nothing."""
        del features, tfds_name
        return None

    def stored_shapes(self) -> dict[str, tuple[int, ...]]:
        """{feature key: the shape this task expects the dataset to store it in}, checked against the dataset's
        metadata before anything is built (data/registry.py bind_task); {} = nothing to check."""
        return {}

    def decoders(self, features: tfds.features.FeaturesDict) -> dict:
        """TFDS decoders for reading the split into memory: by default every feature decoded."""
        del features
        return {}

    def bind(self, builder: tfds.core.DatasetBuilder) -> "Task":
        """This task completed from the prepared dataset (e.g. class names); by default unchanged."""
        del builder
        return self

    def prepare(self, example: dict, features: tfds.features.FeaturesDict, *, seed: tf.Tensor | None = None):
        """One example (a dict of the `keys`, as read) -> (model input, target) with static shapes."""
        raise NotImplementedError

    def prepare_batch(self, examples: dict, features: tfds.features.FeaturesDict, *, seeds: tf.Tensor):
        """A batch of training examples (a dict of the `keys`, each [B, ...]) -> (model inputs [B, ...], targets
        [B, ...]), with `seeds` [B, 2] the examples' stateless seeds. Must equal `prepare` applied per example.

        The default runs `prepare` per example (tf.map_fn); a task whose work is vectorisable overrides it (the
        input pipeline calls it once per batch, so a vectorised version is what keeps the accelerator fed).
        """
        element = {key: tf.TensorSpec(value.shape[1:], value.dtype) for key, value in examples.items()}
        outputs = tf.function(lambda example, seed: self.prepare(example, features, seed=seed)).get_concrete_function(
            element, tf.TensorSpec([2], seeds.dtype)).structured_outputs
        signature = tf.nest.map_structure(lambda tensor: tf.TensorSpec(tensor.shape, tensor.dtype), outputs)
        return tf.map_fn(lambda args: self.prepare(args[0], features, seed=args[1]), (examples, seeds),
                         fn_output_signature=signature)

    def serving_signature(self) -> dict[str, tf.TensorSpec]:
        """The exported signature's inputs: raw features, batched."""
        raise NotImplementedError

    def serve(self, model, inputs: dict) -> dict:
        """The exported signature's body: `inputs` as in `serving_signature` -> named outputs."""
        raise NotImplementedError

    def serving_example(self, example: dict, features: tfds.features.FeaturesDict) -> dict:
        """One stored example (a dict of the `keys`, read with `decoders`) -> the signature's inputs for it, unbatched:
        what a client would send. The export builds its warmup and example requests from eval examples with it; a
        task without it exports without them."""
        raise NotImplementedError

    def serving_metadata(self) -> dict:
        """What a reader of the export needs beside the signature (JSON values): the task, its kind and, per task,
        class names or feature names. Written to the export's assets.extra/serving_metadata.json."""
        return {"task": type(self).__name__, "kind": self.kind}


class ClassificationTask(Task):
    """A task whose target is a class id and whose model outputs logits, one per class."""

    kind = "classification"
    default_loss = "softmax_cross_entropy"
    default_metrics = ("accuracy",)
    # The target is the stored label as is, so its ClassLabel must have `output_size` classes (checked before
    # training). False for a task that maps the stored labels to other classes.
    targets_are_stored_labels = True

    def stored_data_problem(self, features, tfds_name):
        if not self.targets_are_stored_labels:
            return None
        label = features[self.label_key]
        if isinstance(label, tfds.features.ClassLabel):
            if label.num_classes != self.output_size:
                return (f"has {self.output_size} classes, but {tfds_name!r} labels {self.label_key!r} with "
                        f"{label.num_classes} ({', '.join(label.names[:5])}{', ...' if label.num_classes > 5 else ''})")
        elif not label.tf_dtype.is_integer:
            return (f"is a classification task, but {tfds_name!r} stores {self.label_key!r} as "
                    f"{label.tf_dtype.name}, not class ids. Use a regression task for real-valued targets "
                    "(tasks/tabular.py TabularRegression)")
        return None


class RegressionTask(Task):
    """A task whose target is one real number per example; the model's first output is the prediction."""

    kind = "regression"
    default_loss = "mean_squared_error"
    default_metrics = ("mean_absolute_error", "mean_squared_error")


def classification_outputs(logits: tf.Tensor, class_names: tuple[str, ...] | None) -> dict:
    """Serving outputs of a classifier: logits, probabilities, class ids and (if known) class names."""
    logits = tf.cast(logits, tf.float32)
    classes = tf.argmax(logits, axis=-1, output_type=tf.int32)
    outputs = {"logits": logits, "probabilities": tf.nn.softmax(logits), "classes": classes}
    if class_names:
        outputs["class_names"] = tf.gather(tf.constant(class_names), classes)
    return outputs


def label_names(builder: tfds.core.DatasetBuilder, label_key: str) -> tuple[str, ...] | None:
    """The ClassLabel names of `label_key` in the dataset's metadata, or None."""
    feature = builder.info.features[label_key] if label_key in builder.info.features else None
    return tuple(feature.names) if isinstance(feature, tfds.features.ClassLabel) else None
