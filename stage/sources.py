"""Data a user already has, read into columns per split: NumPy `.npz` arrays, TFRecord files of tf.train.Example (with a
feature spec), CSV files (stage/csv_source.py), image folders (stage/images.py) and text folders
(stage/text_folder.py).

Each reader returns `{split: (inputs, labels)}` (NumPy arrays, one row per example); `columns()`
(stage/columns.py) then decides the staged features from the arrays themselves, so every source is described the
same way in the TFDS metadata.
Everything is read into host memory (sizes a laptop holds); for larger data write a TFDS builder
(data/digits/digits_dataset_builder.py is the example). Every bad input is a ConfigError that names it and the fix.
"""

import io
import re

import numpy as np

from common.errors import ConfigError, shorten

SPEC_DTYPES = ("float32", "int64", "image")  # --features dtypes; 'image' = encoded PNG/JPEG bytes.
_SPEC_ITEM = re.compile(r"\s*([\w/.-]+):(\w+)(?:\[([\d,\s]*)\])?\s*(?:,|$)")


def parse_split_paths(value: str, flag: str) -> dict[str, str]:
    """'train=a.csv,test=b.csv' -> {'train': 'a.csv', 'test': 'b.csv'}."""
    pairs = [item.partition("=") for item in value.split(",") if item.strip()]
    if not pairs or any(not split.strip() or not path.strip() or sep != "=" for split, sep, path in pairs):
        raise ConfigError(f"{flag}={value!r} is not a list of SPLIT=PATH pairs; write e.g. "
                          f"{flag}=train=train.csv,test=test.csv")
    return {split.strip(): path.strip() for split, _, path in pairs}


def check_splits(splits: dict, source: str) -> None:
    """Training needs a 'train' split and a 'test' or 'validation' split."""
    if "train" not in splits or not {"test", "validation"} & set(splits):
        raise ConfigError(f"{source} gives the splits {sorted(splits)}; training needs 'train' and 'test' (or "
                          "'validation'). Name them so (e.g. x_train/x_test arrays, train=FILE,test=FILE).")


def check_finite(values: np.ndarray, source: str, split: str, names: str | list[str], line_offset: int = 0) -> None:
    """A ConfigError naming the first NaN or infinite value of float `values` (one row per example): its split, its
    column (`names[column]`, or `names`, e.g. "array 'x_train'", and its position in the row) and its row index."""
    if values.dtype.kind not in "fc" or not values.size:
        return
    rows = values.reshape(len(values), -1)
    bad = ~np.isfinite(rows)
    if not bad.any():
        return
    row = int(np.flatnonzero(bad.any(axis=1))[0])
    column = int(np.flatnonzero(bad[row])[0])
    where = f"column {names[column]!r}" if isinstance(names, list) else names
    line = f" (line {row + line_offset})" if line_offset else ""
    position = f", position {column}" if rows.shape[1] > 1 and not isinstance(names, list) else ""
    raise ConfigError(f"{source}: split {split!r}, {where}, row index {row}{line}{position} is {rows[row, column]}: "
                      "NaN and infinite values cannot be trained on. Drop those rows, or fill them in (e.g. with the "
                      "column's mean), then stage again.")


def read_npz(path: str, keys: str | None, whole: bool = False) -> dict:
    """Arrays `x_SPLIT`/`y_SPLIT` of an .npz file, or the pairs named by `keys` ('train=X:Y,test=X:Y'); when `whole`
    (--test_fraction splits it), one pair as split 'all': `x`/`y`, or the pair `keys` names ('X:Y')."""
    import tensorflow as tf

    if not tf.io.gfile.exists(path):
        raise ConfigError(f"--from_npz={path!r}: no such file. Pass the path of an .npz file (np.savez).")
    if tf.io.gfile.isdir(path):
        raise ConfigError(f"--from_npz={path!r} is a folder, not a file. Pass the path of an .npz file (np.savez) "
                          "in it.")
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            arrays = dict(np.load(io.BytesIO(handle.read()), allow_pickle=False))
    except (ValueError, OSError) as error:
        raise ConfigError(f"--from_npz={path!r} is not a NumPy .npz file ({error}); save it with np.savez.") \
            from error
    if whole:
        pairs = {"all": keys.split(":") if keys else ["x", "y"]}
        if not keys and "x" not in arrays and any(name.startswith("x_") for name in arrays):
            raise ConfigError(f"--from_npz={path!r} has the arrays {sorted(arrays)}: split already, and "
                              "--test_fraction splits one pair x, y. Drop --test_fraction to use its splits, or "
                              "name the pair to split with --npz_keys=INPUTS:LABELS.")
    elif keys:
        pairs = {split: names.split(":") for split, names in parse_split_paths(keys, "--npz_keys").items()}
    else:
        pairs = {name[2:]: [name, "y" + name[1:]] for name in arrays if name.startswith("x_")}
        if "train" not in pairs or not {"test", "validation"} & set(pairs):
            raise ConfigError(f"--from_npz={path!r} has the arrays {sorted(arrays)}, not x_train, y_train and x_test, "
                              "y_test (or x_validation, y_validation). Name them so when saving (np.savez(..., "
                              "x_train=..., y_train=..., x_test=..., y_test=...)), or map yours to the splits with "
                              "--npz_keys=train=INPUTS:LABELS,test=INPUTS:LABELS.")
    splits = {}
    for split, names in pairs.items():
        missing = [name for name in names if name not in arrays]
        if len(names) != 2 or missing:
            fix = ("Name them x and y, or pass --npz_keys=INPUTS:LABELS" if whole else "Name them x_train, y_train, "
                   "x_test, y_test, or pass --npz_keys=train=INPUTS:LABELS,test=INPUTS:LABELS")
            raise ConfigError(f"--from_npz={path!r} has the arrays {sorted(arrays)}, not {missing or names} for "
                              f"{'--test_fraction to split' if whole else f'split {split!r}'}. {fix}.")
        for name in names:
            check_finite(arrays[name], f"--from_npz={path!r}", split, f"array {name!r}")
        splits[split] = (arrays[names[0]], arrays[names[1]])
    if not whole:
        check_splits(splits, f"--from_npz={path!r}")
    return splits


def parse_feature_spec(spec: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """'features:float32[8],label:int64' -> {'features': ('float32', (8,)), 'label': ('int64', ())}."""
    items, position = {}, 0
    while position < len(spec):
        match = _SPEC_ITEM.match(spec, position)
        if not match or match.end() == position:
            raise ConfigError(f"--features={spec!r}: cannot read it from {spec[position:]!r}. Write NAME:DTYPE[SHAPE] "
                              "items separated by commas, e.g. --features='features:float32[8],label:int64'.")
        name, dtype, shape = match.groups()
        if dtype not in SPEC_DTYPES:
            raise ConfigError(f"--features: {name}:{dtype}: unknown dtype {dtype!r}; use one of {SPEC_DTYPES}.")
        items[name] = (dtype, tuple(int(size) for size in (shape or "").split(",") if size.strip()))
        position = match.end()
    return items


def read_tfrecords(patterns: dict[str, str], spec: str, label: str) -> dict:
    """Per split, TFRecord files (a glob) of tf.train.Example with the features of `spec`; `label` is the target."""
    import tensorflow as tf

    check_splits(patterns, "--from_tfrecord")
    features = parse_feature_spec(spec)
    if label not in features or len(features) != 2:
        raise ConfigError(f"--features={spec!r} must name two features, the input and --label={label!r}; pass "
                          "e.g. --features='features:float32[8],label:int64' --label=label.")
    parse_spec = {name: tf.io.FixedLenFeature([] if dtype == "image" else shape,
                                              {"float32": tf.float32, "int64": tf.int64, "image": tf.string}[dtype])
                  for name, (dtype, shape) in features.items()}
    (input_name,) = [name for name in features if name != label]

    def parse(record):
        example = tf.io.parse_single_example(record, parse_spec)
        if features[input_name][0] == "image":
            example[input_name] = tf.io.decode_image(example[input_name], expand_animations=False)
        return example[input_name], example[label]

    splits = {}
    for split, pattern in patterns.items():
        files = sorted(tf.io.gfile.glob(pattern))
        if not files:
            raise ConfigError(f"--from_tfrecord: {split}={pattern!r} matches no file. Check the folder and the file "
                              "names (quote the glob so the shell does not expand it), e.g. "
                              "--from_tfrecord='train=data/train-*.tfrecord,test=data/test-*.tfrecord'.")
        _check_first_record(files, features, f"--from_tfrecord: {split}={pattern!r}")
        try:
            inputs, labels = zip(*tf.data.TFRecordDataset(files).map(parse).as_numpy_iterator(), strict=True)
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
            detail = shorten(error.message.split("}}")[-1], 300)  # Without TF's "{{function_node ...}}".
            raise ConfigError(f"--from_tfrecord: {split}={pattern!r} does not match --features={spec!r} "
                              f"({detail}). Give each feature's dtype and shape as stored.") from None
        except ValueError:  # zip of nothing: empty files.
            raise ConfigError(f"--from_tfrecord: {split}={pattern!r} holds no records (the files {files[:3]} are "
                              "empty). Check that the glob names the files the data were written to, and that the "
                              "writer was closed (tf.io.TFRecordWriter flushes on close).") from None
        splits[split] = (_stack(inputs, f"--from_tfrecord {split}"), np.asarray(labels))
        for name, values in zip((input_name, label), splits[split], strict=True):
            check_finite(values, f"--from_tfrecord: {split}={pattern!r}", split, f"feature {name!r}")
    return splits


_STORED_AS = {"float_list": "float32", "int64_list": "int64", "bytes_list": "bytes (image)"}


def _check_first_record(files: list[str], features: dict, where: str) -> None:
    """Compares the first record's features with --features (names, kinds, value counts); a ConfigError that names
    the feature, what is stored and the --features that would read it, before TensorFlow's parser fails on them."""
    import tensorflow as tf

    first = next(iter(tf.data.TFRecordDataset(files[:1]).take(1)), None)
    if first is None:
        return  # No records: reported with the files' names by the caller.
    try:
        stored = tf.train.Example.FromString(first.numpy()).features.feature
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError, which it does not export stably.
        raise ConfigError(f"{where}: the records are not tf.train.Example protos ({error}). Write them with "
                          "tf.train.Example(...).SerializeToString().") from None
    kinds = {}  # name -> (the feature's kind, its number of values)
    for name, feature in stored.items():
        kind = feature.WhichOneof("kind")
        kinds[name] = (kind, len(getattr(feature, kind).value) if kind else 0)
    as_stored = {name: "image" if kind == "bytes_list" else
                 f"{_STORED_AS.get(kind, 'float32')}{'' if kind == 'int64_list' and count == 1 else f'[{count}]'}"
                 for name, (kind, count) in kinds.items()}
    wanted = ",".join(f"{name}:{as_stored[name]}" for name in features if name in as_stored)
    for name, (dtype, shape) in features.items():
        if name not in stored:
            raise ConfigError(f"{where}: the records have no feature {name!r} (they have {sorted(stored)}); name "
                              "the stored features in --features.")
        kind, count = kinds[name]
        expected_kind = {"float32": "float_list", "int64": "int64_list", "image": "bytes_list"}[dtype]
        expected_count = 1 if dtype == "image" else int(np.prod(shape, dtype=np.int64))
        if kind != expected_kind or count != expected_count:
            said = dtype + (f"[{','.join(map(str, shape))}]" if shape else "")
            raise ConfigError(f"{where}: feature {name!r} is stored as {_STORED_AS.get(kind, kind)} with {count} "
                              f"value(s) per record; --features says {said}. Give each feature's dtype and shape as "
                              f"stored, e.g. --features='{wanted}'.")


def _stack(rows, what: str) -> np.ndarray:
    shapes = sorted({np.shape(row) for row in rows})
    if len(shapes) > 1:
        raise ConfigError(f"{what}: examples of different shapes {shapes[:4]}; every example needs the same shape "
                          "(resize or pad them first).")
    return np.stack(rows)
