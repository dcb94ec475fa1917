"""Files a user has -> the batch an export's signature takes, checked against its metadata (serving/metadata.py).

What is read depends on the signature's one input:
- images (uint8 [batch, H, W, C]): an image file (PNG, JPEG, GIF, BMP) or a folder of them, each exactly H x W x C;
  for an export that resizes (staged with --image_size: [batch, any, any, C]) of any size, converted to C channels
  (tasks/image_resize.py) and returned as a list (one array per image: the signature takes one size per batch);
- feature vectors (numbers [batch, D]): a CSV file, one example per row; with a header row its columns are found by
  the metadata's feature names (other columns are ignored) and, for data staged with --id_column, each prediction is
  keyed by the row's id; without one each row holds the D values in order; NaN and infinite values are refused
  (naming the line and column), in any input, before the model sees them;
- strings ([batch]): a text file, one example per line (blank lines skipped);
and for any signature a .npy array (the batch, of the input's dtype or one that converts exactly) or a .json request
`{"instances": [...]}` as Vertex AI takes it (serving/requests.py). Everything that is wrong is a ConfigError (exit 2)
naming the file, the value and what was expected. Only images need TensorFlow (to decode them).
"""

import csv
import json
import os
import re

import numpy as np

from common.errors import ConfigError
from serving import requests

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp")


def read(path: str, metadata: dict) -> tuple[str, list[str], dict]:
    """(the name of the output's key column: 'input', or a CSV's id column; a key per example: file, line, text or
    the id; {input name: array [n, ...]}) from `path`. Non-finite numbers are refused, naming the row and column."""
    inputs = metadata["inputs"]
    suffix = os.path.splitext(path)[1].lower()
    if not os.path.exists(path):
        raise ConfigError(f"--input={path}: no such file or folder.")
    takes_images = any(description["dtype"] == "uint8" and len(description["shape"]) == 4
                       for description in inputs.values())
    if os.path.isdir(path) and not (takes_images and len(inputs) == 1):
        raise ConfigError(f"--input={path} is a folder; this export takes {', '.join(sorted(inputs))}: give a file "
                          "(a folder is read for image exports only).")
    key = "input"
    if suffix == ".json":
        labels, batch = _read_json(path, inputs)
    else:
        if len(inputs) != 1:
            raise ConfigError(f"--input={path}: this export takes several inputs ({', '.join(sorted(inputs))}); give "
                              'them as a .json request {"instances": [{...}, ...]} (docs/serving.md).')
        name, description = next(iter(inputs.items()))
        if suffix == ".npy":
            labels, values = _read_npy(path, name, description)
        elif description["dtype"] == "string":
            labels, values = _read_lines(path)
        elif takes_images:
            labels, values = _read_images(path, description["shape"])
        elif len(description["shape"]) == 2 and suffix == ".csv":
            key, labels, values = _read_csv(path, description, metadata.get("feature_names"),
                                            metadata.get("id_column"))
        else:
            raise ConfigError(f"--input={path}: this export takes {name!r} ({description['dtype']}, shape "
                              f"{description['shape']}); give a {'.csv, ' if len(description['shape']) == 2 else ''}"
                              ".npy or .json file.")
        batch = {name: values}
    if not labels:
        raise ConfigError(f"--input={path} holds no examples; give at least one.")
    for name, values in batch.items():
        _check_finite(path, name, values, metadata.get("feature_names"))
    return key, labels, batch


def _check_finite(path: str, name: str, values, feature_names: list[str] | None) -> None:
    """A ConfigError naming the first NaN or infinite value of a float input (a .npy, a .json request): the model
    would answer it (every NaN row the same class; inf gives NaN probabilities)."""
    if not isinstance(values, np.ndarray) or values.dtype.kind != "f" or np.isfinite(values).all():
        return
    row, *position = (int(index) for index in np.argwhere(~np.isfinite(values))[0])
    column = (f", column {feature_names[position[0]]!r}" if feature_names and len(position) == 1 else
              f", position {position}" if position else "")
    raise ConfigError(f"--input={path}: {name!r} row {row}{column} is {values[(row, *position)]}: the model cannot "
                      "answer for NaN or infinite features; fill the value in or drop the row.")


def _read_json(path: str, inputs: dict) -> tuple[list[str], dict]:
    try:
        with open(path, encoding="utf-8") as handle:
            request = json.load(handle)
        batch = requests.to_batch(request, inputs)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"--input={path} is not JSON ({error}); give a request {{\"instances\": [...]}}.") from None
    except ValueError as error:
        raise ConfigError(f"--input={path}: {error} (docs/serving.md, Vertex AI).") from None
    return [str(index) for index in range(len(next(iter(batch.values()))))], batch


def _read_npy(path: str, name: str, description: dict) -> tuple[list[str], np.ndarray]:
    try:
        values = np.load(path, allow_pickle=False)
    except ValueError as error:  # An object array (e.g. of bytes) needs pickle, which is not loaded from files.
        raise ConfigError(f"--input={path}: cannot read it without pickle ({error}); save strings as "
                          "np.array([...], dtype=str).") from None
    except OSError as error:
        raise ConfigError(f"--input={path} is not a .npy file ({error}).") from None
    if description["dtype"] == "string":
        if values.dtype.kind not in "US" or values.ndim != 1:
            raise ConfigError(f"--input={path}: {name!r} must be a 1-D array of strings; got {values.dtype} of shape "
                              f"{values.shape}.")
        values = np.array([value.encode("utf-8") if isinstance(value, str) else value for value in values.tolist()],
                          dtype=object)
    else:
        try:
            requests.check_shape(values, description["shape"], name)
            values = requests.cast(values, description["dtype"], name)
        except ValueError as error:
            raise ConfigError(f"--input={path}: {error}.") from None
    return [str(index) for index in range(len(values))], values


def _read_lines(path: str) -> tuple[list[str], np.ndarray]:
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [line.rstrip("\r\n") for line in handle if line.strip()]
    except UnicodeDecodeError as error:
        raise ConfigError(f"--input={path} is not UTF-8 text ({error}).") from None
    return lines, np.array([line.encode("utf-8") for line in lines], dtype=object)


def _read_csv(path: str, description: dict, feature_names: list[str] | None,
              id_column: str | None) -> tuple[str, list[str], np.ndarray]:
    """('input' or `id_column`, 'line N' or the row's id per row, the feature rows): with a header row, the columns
    named `feature_names` (and the id column, when the header has it); without one, the features in order."""
    width = description["shape"][1]
    with open(path, newline="", encoding="utf-8") as handle:
        rows = [(number, [cell.strip() for cell in row]) for number, row in enumerate(csv.reader(handle), start=1)
                if any(cell.strip() for cell in row)]
    columns, fields, ids = list(range(width)), width, None
    names = feature_names or [f"feature_{index}" for index in range(width)]
    if rows and not all(_is_number(cell) for cell in rows[0][1]):  # A header row: the columns by name.
        header = rows.pop(0)[1]
        missing = [name for name in feature_names or () if name not in header]
        if missing or not feature_names:
            raise ConfigError(f"--input={path}: the header row lacks the feature column(s) {missing}; this export "
                              f"reads {width} columns named {feature_names}.")
        columns, fields = [header.index(name) for name in feature_names], len(header)
        ids = header.index(id_column) if id_column in header else None
    values = np.zeros([len(rows), width], np.float32)
    for index, (number, row) in enumerate(rows):
        if len(row) != fields:
            raise ConfigError(f"--input={path}, line {number}: {len(row)} fields, expected {fields} (the "
                              f"{'header' if fields != width else 'features'}); fix or drop the row.")
        for position, column in enumerate(columns):
            if not _is_number(row[column]):
                raise ConfigError(f"--input={path}, line {number}, column {column + 1}: {row[column]!r} is not a "
                                  "number; every feature must be one.")
            values[index, position] = float(row[column])
            if not np.isfinite(values[index, position]):
                raise ConfigError(f"--input={path}, line {number}, column {names[position]!r}: {row[column]!r} is "
                                  "not a finite number: the model cannot answer for NaN or infinite features; fill "
                                  "the value in or drop the row.")
    if ids is not None:
        return id_column, [row[ids] for _, row in rows], values
    return "input", [f"line {number}" for number, _ in rows], values


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _read_images(path: str, shape: list) -> tuple[list[str], np.ndarray]:
    """Decodes with TensorFlow (imported here, after every check that needs none)."""
    if os.path.isdir(path):
        files = _image_files(path)
        if not files:
            raise ConfigError(f"--input={path} holds no image files ({', '.join(IMAGE_SUFFIXES)}), nor do its "
                              "sub-folders.")
        paths = [os.path.join(path, name) for name in files]
    else:
        files, paths = [path], [path]
    import tensorflow as tf

    expected = tuple(shape[1:])
    any_size = expected[0] is None or expected[1] is None
    images = []
    for file_path in paths:
        try:
            image = tf.io.decode_image(tf.io.read_file(file_path), expand_animations=False).numpy()
        except tf.errors.OpError as error:
            # TensorFlow's message without its "{{function_node ...}}" prefix and "[Op:...]" suffix.
            reason = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:.*", "", error.message).strip()
            raise ConfigError(f"--input={file_path} is not an image TensorFlow can decode ({reason}); give "
                              f"{', '.join(IMAGE_SUFFIXES)} files.") from None
        if any_size:
            from tasks.image_resize import convert_channels

            images.append(np.asarray(convert_channels(image, expected[2])))  # Resized by the export's graph.
            continue
        if image.shape != expected:
            raise ConfigError(f"--input={file_path} is {'x'.join(map(str, image.shape))} (height x width x "
                              f"channels); this export takes {'x'.join(map(str, expected))}: resize it first.")
        images.append(image)
    if any_size:
        return files, images
    return files, np.stack(images) if images else np.zeros([0, *expected], np.uint8)


def _image_files(folder: str) -> list[str]:
    """The image files under `folder`, as paths relative to it, sorted: its own and those in its sub-folders, so a
    folder staged by class (`cat/1.png`, `dog/2.png`) is read as it is, each row named `class/file`."""
    found = []
    for root, folders, names in os.walk(folder):
        folders.sort()
        found += [os.path.relpath(os.path.join(root, name), folder) for name in names
                  if name.lower().endswith(IMAGE_SUFFIXES)]
    return sorted(found)
