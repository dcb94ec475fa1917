"""`DATASET='tfds:NAME'`: a DatasetSpec read from a TFDS dataset's own metadata (its features and splits), so a
dataset staged with `python -m stage --from_...` (or any TFDS dataset) trains by name with no code.

The task follows from the features (one input, one target; the dataset's supervised_keys decide when set):
- an Image + a ClassLabel -> ImageClassification: shape and classes from the metadata; pixels scaled by 255 then
  standardised with mean 0.5, std 0.5 (to [-1, 1]), since the metadata holds no pixel statistics; images resized
  at staging (--image_size) are served at any size, resized the same way in the export's graph (serving_resize);
- a float vector (Tensor [D]) + a ClassLabel -> TabularClassification; + a float scalar -> TabularRegression
  (both standardise with the train split's statistics, computed when the run starts; a CSV's column names and id
  column, recorded in the features' documentation, go to the export's metadata for `python -m tools.predict`);
- a Text + a ClassLabel -> TextClassification: tokenised in the graph to 32 token ids, with a vocabulary of up to 998
  words counted on the train split when the run starts (tasks/text_classification.py); the export serves raw strings.
Splits: 'train', and 'test' (else 'validation') for evaluation. For anything else (augmentation, other statistics,
other keys) register a DatasetSpec in data/registry.py; `python -m stage` prints one to start from.
"""

import numpy as np

from common.errors import ConfigError
from data.builders import find_builder
from data.spec import DatasetSpec


def spec_from_metadata(name: str, data_dir: str | None):
    """The DatasetSpec of TFDS dataset `name` (as found in `data_dir`), its task inferred from the features."""
    builder = find_builder(name, data_dir)
    splits = set(builder.info.splits) or {"train", "test"}  # No split metadata before a registered dataset's download.
    eval_split = "test" if "test" in splits else "validation" if "validation" in splits else None
    if "train" not in splits or eval_split is None:
        raise ConfigError(f"DATASET='tfds:{name}' has the splits {sorted(splits)}; training by name needs 'train' and "
                          "'test' (or 'validation'). Stage it with those splits, or register a DatasetSpec with its "
                          "split names in data/registry.py.")
    return DatasetSpec(tfds_name=name, train_split="train", eval_split=eval_split,
                       task=infer_task(builder.info, f"tfds:{name}"), name=f"tfds:{name}")


def infer_task(info, dataset: str):
    """The Task for a dataset with these features (see the module docstring); a ConfigError when none fits."""
    import tensorflow_datasets as tfds

    from tasks.image_classification import ImageClassification
    from tasks.tabular import TabularClassification, TabularRegression
    from tasks.text_classification import TextClassification

    features = info.features
    if info.supervised_keys and all(isinstance(key, str) for key in info.supervised_keys[:2]):
        input_key, target_key = info.supervised_keys[:2]
    else:
        inputs = [key for key, feature in features.items() if _is_input(feature)]
        targets = [key for key, feature in features.items() if _is_target(feature)]
        if len(inputs) != 1 or len(targets) != 1:
            raise ConfigError(f"DATASET={dataset!r}: cannot tell input and target apart among its features "
                              f"{dict(features.items())}: it needs one image, text or float vector and one class label "
                              "or float scalar. Register a DatasetSpec with the task's keys in data/registry.py.")
        input_key, target_key = inputs[0], targets[0]
    image, target = features[input_key], features[target_key]
    if isinstance(image, tfds.features.Image) and isinstance(target, tfds.features.ClassLabel):
        if None in image.shape:
            raise ConfigError(f"DATASET={dataset!r}: its images have no fixed shape ({image.shape}); resize them to "
                              "one shape and stage again, or register a DatasetSpec with decoders that resize.")
        channels = image.shape[-1]
        return ImageClassification(num_classes=target.num_classes, image_shape=tuple(image.shape),
                                   mean=(0.5,) * channels, std=(0.5,) * channels, image_key=input_key,
                                   label_key=target_key, serving_resize=staged_image_resize(image))
    if isinstance(image, tfds.features.Text) and isinstance(target, tfds.features.ClassLabel):
        return TextClassification(num_classes=target.num_classes, text_key=input_key, label_key=target_key)
    if _is_input(image) and not isinstance(image, (tfds.features.Image, tfds.features.Text)) and len(image.shape) == 1:
        if isinstance(target, tfds.features.ClassLabel):
            return TabularClassification(num_features=image.shape[0], num_classes=target.num_classes,
                                         features_key=input_key, label_key=target_key,
                                         feature_names=staged_feature_names(image), id_column=staged_id_column(image))
        if _is_target(target):
            return TabularRegression(num_features=image.shape[0], features_key=input_key, label_key=target_key,
                                     feature_names=staged_feature_names(image), id_column=staged_id_column(image))
    raise ConfigError(f"DATASET={dataset!r}: no task fits the input {input_key!r} ({image}) and target "
                      f"{target_key!r} ({target}); register a DatasetSpec with a task in data/registry.py.")


def _is_input(feature) -> bool:
    import tensorflow_datasets as tfds

    if isinstance(feature, (tfds.features.Image, tfds.features.Text)):
        return True
    return (type(feature) is tfds.features.Tensor and len(feature.shape) == 1
            and np.issubdtype(feature.np_dtype, np.floating))


def _is_target(feature) -> bool:
    import tensorflow_datasets as tfds

    if isinstance(feature, tfds.features.ClassLabel):
        return True
    return (isinstance(feature, tfds.features.Tensor) and not isinstance(feature, tfds.features.ClassLabel)
            and feature.shape == () and np.issubdtype(feature.np_dtype, np.floating))


def registry_lines(dataset: str, spec) -> str:
    """The DatasetSpec of `spec` as Python to paste into DATASETS of data/registry.py (and edit)."""
    task = spec.task
    settings = ", ".join(f"{field}={getattr(task, field)!r}" for field in task.__dataclass_fields__
                         if field != "class_names" and getattr(task, field) != task.__dataclass_fields__[field].default)
    return (f'    "{dataset}": DatasetSpec(tfds_name="{spec.tfds_name}", train_split="{spec.train_split}", '
            f'eval_split="{spec.eval_split}",\n'
            f"        task={type(task).__name__}({settings})),")


def _documentation(*records: tuple[str, object]):
    """A tfds Documentation whose description has a line per (prefix, value): the prefix followed by the value as
    JSON."""
    import json

    import tensorflow_datasets as tfds

    return tfds.features.Documentation(desc="\n".join(prefix + json.dumps(value) for prefix, value in records))


def _recorded(feature, prefix: str):
    """The JSON value that `_documentation` recorded after `prefix` in `feature`'s documentation; None when the
    feature has no such record or it does not parse."""
    import json

    description = getattr(getattr(feature, "doc", None), "desc", "") or ""
    line = next((line for line in description.splitlines() if line.startswith(prefix)), None)
    if line is None:
        return None
    try:
        return json.loads(line[len(prefix):])
    except ValueError:
        return None


# How `python -m stage` keeps a CSV's column names in the TFDS metadata: the 'features' Tensor's documentation
# (features.json, "description"), read back into the tabular task's feature_names, so the export's serving metadata
# and `python -m tools.predict` read a CSV by the header it was staged from; and its --id_column, left out of the
# features, by which `python -m tools.predict` keys each prediction.
_FEATURE_NAMES_PREFIX = "Feature columns, in order: "
_ID_COLUMN_PREFIX = "Id column (not a feature): "


def feature_names_doc(names: list[str], id_column: str | None = None):
    """The tfds Documentation that records `names` and, when given, `id_column`."""
    records = [(_FEATURE_NAMES_PREFIX, list(names))]
    return _documentation(*records, *([(_ID_COLUMN_PREFIX, id_column)] if id_column is not None else []))


def staged_feature_names(feature) -> tuple[str, ...] | None:
    """The column names recorded in `feature`'s documentation, if it holds them, one per value; else None (staged
    from an npz or TFRecords, or before the names were kept: feature_0, feature_1, ...)."""
    names = _recorded(feature, _FEATURE_NAMES_PREFIX)
    valid = isinstance(names, list) and all(isinstance(name, str) for name in names) and \
        len(names) == feature.shape[0] and len(set(names)) == len(names)
    return tuple(names) if valid else None


def staged_id_column(feature) -> str | None:
    """The id column recorded in `feature`'s documentation (python -m stage --id_column), or None."""
    recorded = _recorded(feature, _ID_COLUMN_PREFIX)
    return recorded if isinstance(recorded, str) else None


# How `python -m stage --image_size=H,W --resize=MODE` keeps the resize in the TFDS metadata: the 'image'
# feature's documentation, read back into the image task's serving_resize, so the export resizes a client's images
# exactly as staging did (tasks/image_resize.py).
_IMAGE_RESIZE_PREFIX = "Resized at staging (height, width, mode): "


def image_resize_doc(height: int, width: int, mode: str):
    """The tfds Documentation that records a resize to `height` x `width` by `mode`."""
    return _documentation((_IMAGE_RESIZE_PREFIX, [int(height), int(width), mode]))


def staged_image_resize(feature) -> tuple[int, int, str] | None:
    """(H, W, mode) recorded in the image `feature`'s documentation when it matches the feature's shape; else None
    (images staged at their own size, or by another builder: the export takes exactly the stored shape)."""
    from tasks.image_resize import MODES

    recorded = _recorded(feature, _IMAGE_RESIZE_PREFIX)
    if not (isinstance(recorded, list) and len(recorded) == 3):
        return None
    height, width, mode = recorded
    valid = isinstance(mode, str) and mode in MODES and [height, width] == list(feature.shape[:2])
    return (int(height), int(width), mode) if valid else None
