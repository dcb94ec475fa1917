"""CSV files with a header row, read into `{split: (inputs, labels)}` as stage/sources.py's readers do: numeric
feature columns (a float vector per example), or one text column (`--text=COLUMN`, or detected when it is the only
column besides the label) as one string per example, which stage/columns.py stages as a tfds Text feature.
Every bad cell is a ConfigError naming the file, the line and the column.
"""

import logging

import numpy as np

from common.errors import ConfigError
from stage import csv_header, utf8_text
from stage.sources import check_finite

log = logging.getLogger(__name__)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_csv(paths: dict[str, str], label: str, text: str | None = None, *, id_column: str | None = None,
             drop_columns: list[str] = ()) -> tuple[dict, list[str] | None]:
    """(splits, feature column names or None for text): per split, a CSV file with a header row: the `label` column
    and numeric feature columns, or the `text` column (--text; other columns are left out) as one string per example
    (the caller checks the split names: one file is split 'all', which --test_fraction splits). `id_column` and
    `drop_columns` are left out of the features (stage/csv_header.py). Without `text`, a CSV whose only column
    besides those holds anything but numbers (in the first split's file) is read as text, and said so in the log. The
    feature names are kept in the staged metadata, so the export reads CSVs by them."""
    splits, header, features = {}, None, None
    for split, path in paths.items():  # One file after the other: a bad cell is named before the next file is read.
        rows = _read_split_rows(split, path, header)
        if header is None:
            header = rows[0]
            features = csv_header.feature_columns(header, path, label, text=text, id_column=id_column,
                                                  drop_columns=drop_columns)
            text = _text_column(path, rows, label, text, features)
            features = [text] if text is not None else features
        splits[split] = _split_columns(split, path, rows, label, features, text is not None)
    if text is not None:
        return splits, None
    _warn_of_id_like_columns(splits, features)
    return splits, features


def _text_column(path: str, rows: list[list[str]], label: str, text: str | None, others: list[str]) -> str | None:
    """The text column: `text` (checked), or the only column of `others` (the columns besides the label, an id and
    the dropped ones) when it holds anything but numbers; None for numeric feature columns."""
    header = rows[0]
    if text is None and len(others) == 1 and not all(_is_number(row[header.index(others[0])]) for row in rows[1:]):
        text = others[0]
        log.info("--from_csv: column %r, the only one besides --label=%r, holds text: staged as a text dataset "
                 "(--text=%s says so explicitly).", text, label, text)
    elif text is not None:  # A column of the header (csv_header.feature_columns).
        left_out = [name for name in others if name != text]
        if left_out:
            log.info("--from_csv: --text=%r: the columns %s are left out (the text task reads one text column).",
                     text, left_out)
    return text


def _split_columns(split: str, path: str, rows: list[list[str]], label: str, features: list[str],
                   is_text: bool) -> tuple:
    """(inputs, labels) of one split's rows: float vectors of the `features` columns, or (`is_text`) the strings of
    its one column."""
    header = rows[0]
    index, positions = header.index(label), [header.index(name) for name in features]
    values, labels = [], []
    for number, row in enumerate(rows[1:], start=2):
        empty = [header[position] for position in [index, *positions] if not row[position].strip()]
        if empty:
            raise ConfigError(f"{path}, line {number}: no value in column(s) {empty}. Fill the missing values in "
                              "or drop those rows (every example needs every column).")
        labels.append(row[index])
        if is_text:
            values.append(row[positions[0]])
            continue
        try:
            values.append([float(row[position]) for position in positions])
        except ValueError:
            name, cell = next((header[position], row[position]) for position in positions
                              if not _is_number(row[position]))
            raise ConfigError(f"{path}, line {number}: column {name!r} holds {cell!r}, not a number. Feature "
                              f"columns must be numbers: drop or encode that column (--drop_columns={name} drops "
                              f"it; or fix the value), or, if it is the text to classify, pass --text={name}.") \
                from None
    if is_text:
        return np.asarray(values, dtype=object), _label_array(labels)
    columns = (np.asarray(values, np.float32).reshape(len(values), len(features)), _label_array(labels))
    check_finite(columns[0], f"--from_csv: {path}", split, features, 2)
    check_finite(columns[1], f"--from_csv: {path}", split, [label], 2)
    return columns


# A column of whole numbers, a different one in every row, over at least this many rows looks like an id.
MIN_ROWS_OF_AN_ID = 10


def _warn_of_id_like_columns(splits: dict, features: list[str]) -> None:
    """Logs a warning for each feature column that holds a different whole number in every row (of every split), as
    an id column does: trained as a feature, the model would learn from the row's number."""
    values = np.concatenate([inputs for inputs, _ in splits.values()]).astype(np.float64)
    if len(values) < MIN_ROWS_OF_AN_ID:
        return
    for position, name in enumerate(features):
        column = values[:, position]
        if np.all(np.mod(column, 1) == 0) and len(np.unique(column)) == len(column):
            log.warning("--from_csv: column %r holds a different whole number in each of the %d rows, as an id "
                        "does; staged as a feature, the model would learn from it. If it is an id, pass "
                        "--id_column=%s (left out of the features; python -m tools.predict keys its predictions by "
                        "it) or --drop_columns=%s.", name, len(column), name, name)


def _read_split_rows(split: str, path: str, header: list[str] | None) -> list[list[str]]:
    """The rows of one split's CSV file, checked: it exists, is not empty, has the other splits' `header` (when read
    already) and as many fields in every row as in its header (its columns: csv_header.feature_columns)."""
    import tensorflow as tf

    if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
        what = "a folder, not a file" if tf.io.gfile.exists(path) else "no such file"
        where = f"--from_csv={path!r}" if split == "all" else f"--from_csv: {split}={path!r}"
        raise ConfigError(f"{where}: {what}. Pass an existing CSV path (local or gs://), "
                          "e.g. --from_csv=train=train.csv,test=test.csv.")
    rows = _read_csv_rows(path)
    if not rows:
        raise ConfigError(f"--from_csv: {path} is empty; give it a header row and one row per example.")
    if header is not None and rows[0] != header:
        raise ConfigError(f"{path} has the columns {rows[0]}, the other split {header}: give every split the "
                          "same header.")
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(rows[0]):
            raise ConfigError(f"{path}, line {number}: {len(row)} fields, the header has {len(rows[0])}. Fix or "
                              "remove that line (a value with a comma needs quotes).")
    return rows


def _read_csv_rows(path: str) -> list[list[str]]:
    """The non-empty rows of the CSV file `path`; a ConfigError for a file that is not UTF-8 text (Latin-1, a
    spreadsheet's binary format, a compressed file), which Python's csv module would fail on with a traceback."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as handle:
        text = utf8_text.decode(handle.read(), named=f"--from_csv: {path}",
                                not_utf8_fix="save it as CSV in UTF-8 (e.g. iconv -f latin1 -t utf-8, or the "
                                             "spreadsheet's 'CSV UTF-8' format).",
                                binary_fix="CSV file (a binary or compressed file?): export it as CSV in UTF-8.")
    return csv_header.parse_rows(text, path)


def _label_array(labels: list[str]) -> np.ndarray:
    """CSV label cells as ints, floats or strings, whichever all of them are."""
    for kind in (int, float):
        try:
            return np.asarray([kind(value) for value in labels])
        except ValueError:
            continue
    return np.asarray(labels)
