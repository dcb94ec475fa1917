"""The staged features of data read from a user's own files (stage/sources.py, stage/images.py), decided
from the arrays themselves, so every source is described the same way in the TFDS metadata:
- inputs: a float vector per example -> 'features' (tfds Tensor float32 [D]); uint8 arrays of rank 2 or 3 per
  example -> 'image' (tfds Image, PNG); one string per example -> 'text' (tfds Text), whose labels must be classes;
- labels: strings or integers -> 'label' (tfds ClassLabel: the sorted strings, or 0..max); floats -> 'target'
  (a float32 scalar, for regression). `label_kind` ('class' or 'number') overrides the guess.
"""

import numpy as np

from common.errors import ConfigError

# Integer labels stage as the classes 0..max; more classes than examples is refused once above this many.
MIN_REFUSED_CLASSES = 1000


def columns(splits: dict, label_kind: str = "auto", class_names: list[str] | None = None,
            feature_names: list[str] | None = None, image_resize: tuple | None = None, id_column: str | None = None):
    """(TFDS FeaturesDict, {split: {feature: array}}) for `{split: (inputs, labels)}`; see the module docstring.
    `feature_names` (a CSV's columns) and `id_column` (the CSV's id column, left out of them) are kept in the
    'features' Tensor's documentation, `image_resize` (H, W, mode: how an image folder was resized) in the 'image'
    feature's (data/staged_spec.py)."""
    import tensorflow_datasets as tfds

    from data.staged_spec import feature_names_doc, image_resize_doc

    for split, (inputs, labels) in splits.items():
        if len(inputs) != len(labels):
            raise ConfigError(f"Split {split!r} has {len(inputs)} inputs but {len(labels)} labels; give one label per "
                              "example.")
        if not len(inputs):
            raise ConfigError(f"Split {split!r} is empty; give it at least one example.")
    shapes = {split: tuple(inputs.shape[1:]) for split, (inputs, _) in splits.items()}
    if len(set(shapes.values())) > 1:
        raise ConfigError(f"The splits' inputs have different shapes per example: {shapes}; make them equal.")
    first_inputs = next(iter(splits.values()))[0]
    shape = shapes[next(iter(shapes))]
    _check_inputs(first_inputs.dtype, shape)
    if first_inputs.dtype.kind in "UO" and not shape:
        input_key, input_feature = "text", tfds.features.Text()
        convert = lambda inputs: inputs.astype(str)  # noqa: E731
    elif first_inputs.dtype == np.uint8 and len(shape) in (2, 3):
        input_key, image_shape = "image", shape if len(shape) == 3 else (*shape, 1)
        input_feature = tfds.features.Image(shape=image_shape, dtype=np.uint8,
                                            doc=image_resize_doc(*image_resize) if image_resize else None)
        convert = lambda inputs: inputs.reshape(len(inputs), *image_shape)  # noqa: E731
    elif len(shape) == 1 and np.issubdtype(first_inputs.dtype, np.number):
        documentation = (feature_names_doc(feature_names, id_column) if feature_names and len(feature_names) == shape[0]
                         else None)
        input_key, input_feature = "features", tfds.features.Tensor(shape=shape, dtype=np.float32, doc=documentation)
        convert = lambda inputs: inputs.astype(np.float32)  # noqa: E731
    else:
        raise ConfigError(f"Inputs of shape {shape} and dtype {first_inputs.dtype} per example are neither a "
                          "feature vector (shape (D,), numbers) nor an image (uint8, (H, W) or (H, W, C)); reshape "
                          "rows to vectors, or images to uint8.")
    label_key, label_feature, to_ids = _label_feature({split: labels for split, (_, labels) in splits.items()},
                                                      label_kind, class_names)
    if input_key == "text" and label_key != "label":
        raise ConfigError("The labels of a text dataset must be classes (text or whole numbers): the shipped text task "
                          "classifies, it does not regress. Pass --label_kind=class (or auto) and class labels.")
    staged = {split: {input_key: convert(inputs), label_key: to_ids(labels)}
              for split, (inputs, labels) in splits.items()}
    if isinstance(label_feature, tfds.features.ClassLabel):
        _check_classes_in_train(staged, label_feature)
    return tfds.features.FeaturesDict({input_key: input_feature, label_key: label_feature}), staged


def _check_inputs(dtype: np.dtype, shape: tuple) -> None:
    """Inputs that would stage but not train: complex numbers (cast to float32 they lose their imaginary part, with
    only a NumPy warning) and examples with no values (shape (0,): TensorFlow's CPU kernels abort the process)."""
    if dtype.kind == "c":
        raise ConfigError(f"The inputs are complex numbers ({dtype}); staging would drop their imaginary part. Split "
                          "them into real columns first (e.g. np.concatenate([x.real, x.imag], axis=1)).")
    if 0 in shape:
        raise ConfigError(f"The inputs have shape {shape} per example: no values to learn from. Give every example at "
                          "least one feature (a CSV needs a column besides --label; an npz array shape (N, D), D >= "
                          "1).")


def _check_classes_in_train(staged: dict, classes) -> None:
    """Every class of an evaluation split must have examples in 'train': a model cannot learn a class it never sees,
    so such examples would all count as errors (most often a misspelt class folder or a file of the wrong split)."""
    trained = set(staged["train"]["label"].tolist())
    for split, columns in staged.items():
        ids, counts = np.unique(columns["label"], return_counts=True)
        unseen = [(classes.int2str(int(i)), int(count)) for i, count in zip(ids, counts, strict=True)
                  if int(i) not in trained]
        if unseen:
            listed = ", ".join(f"{name!r} ({count} example{'s' if count > 1 else ''})" for name, count in unseen)
            raise ConfigError(f"Split {split!r} has classes that split 'train' has no examples of: {listed}. A model "
                              "cannot learn a class it never sees in training, so these would all count as errors. "
                              "Move some of their examples into train (or fix the class name if it is misspelt), or "
                              f"remove them from {split!r}, then stage again.")


def _label_feature(split_labels: dict[str, np.ndarray], kind: str, class_names: list[str] | None):
    import tensorflow_datasets as tfds

    labels = np.concatenate(list(split_labels.values()))
    if labels.ndim != 1:
        raise ConfigError(f"Labels must be one value per example; got shape {labels.shape[1:]} per example.")
    if labels.dtype.kind == "c":
        raise ConfigError(f"The labels are complex numbers ({labels.dtype}); staging would drop their imaginary "
                          "part. Give class ids (integers) or real numbers (a regression target).")
    if class_names is not None:
        return "label", tfds.features.ClassLabel(names=class_names), lambda values: values.astype(np.int64)
    is_text = labels.dtype.kind in "US"
    integral = not is_text and np.all(np.mod(labels, 1) == 0)
    if kind == "number" or (kind == "auto" and not is_text and labels.dtype.kind == "f"):
        if is_text:
            raise ConfigError("--label_kind=number, but the labels are text; use --label_kind=class.")
        return "target", tfds.features.Scalar(dtype=np.float32), lambda values: values.astype(np.float32)
    if is_text:
        names = sorted(set(labels.tolist()))
        return ("label", tfds.features.ClassLabel(names=names),
                lambda values: np.searchsorted(names, values).astype(np.int64))
    if not integral or labels.min() < 0:
        raise ConfigError(f"Class labels must be integers >= 0; these are not: {_not_class_ids(split_labels)}. "
                          "Number the classes 0, 1, 2, ... the same way in every split, or pass --label_kind=number "
                          "for a regression target.")
    _check_class_count(labels)
    return ("label", tfds.features.ClassLabel(num_classes=int(labels.max()) + 1),
            lambda values: values.astype(np.int64))


def _check_class_count(labels: np.ndarray) -> None:
    """Integer labels stage as the classes 0..max: refused when those are more classes than examples (so most
    classes could have none) and more than MIN_REFUSED_CLASSES: labels such as ids or years, not class numbers
    (labels up to 2e9 would stage as 2e9 classes and exhaust the memory when training builds its output layer)."""
    count = int(labels.max()) + 1
    if count <= max(MIN_REFUSED_CLASSES, len(labels)):
        return
    distinct = len(np.unique(labels))
    raise ConfigError(f"The labels go up to {int(labels.max())}, so they would stage as {count:,} classes (0..max) "
                      f"for {len(labels):,} examples with {distinct:,} distinct labels; python -m stage refuses more "
                      f"classes than examples (above {MIN_REFUSED_CLASSES:,}). Number the classes 0..{distinct - 1} "
                      "(e.g. np.unique(labels, return_inverse=True)), or pass --label_kind=number for a regression "
                      "target.")


def _not_class_ids(split_labels: dict[str, np.ndarray]) -> str:
    """The labels per split that are negative or not whole numbers: "split 'train': -1, 0.5 (3 labels)"."""
    found = []
    for split, labels in split_labels.items():
        wrong = labels[(np.mod(labels, 1) != 0) | (labels < 0)]
        values = np.unique(wrong).tolist()
        if values:
            found.append(f"split {split!r}: {', '.join(map(str, values[:5]))}{', ...' if len(values) > 5 else ''} "
                         f"({len(wrong)} label{'s' if len(wrong) > 1 else ''})")
    return "; ".join(found)
