"""CSV files with a header row, read into `{split: (inputs, labels)}` as data/stage/sources.py's readers do: numeric
feature columns (a float vector per example), or one text column (`--text=COLUMN`, or detected when it is the only
column besides the label) as one string per example, which data/stage/columns.py stages as a tfds Text feature.
Every bad cell is a ConfigError naming the file, the line and the column.
"""

import csv
import io
import logging

import numpy as np

from common.errors import ConfigError
from data.stage import utf8_text
from data.stage.sources import check_finite

log = logging.getLogger(__name__)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_csv(paths: dict[str, str], label: str, text: str | None = None) -> tuple[dict, list[str] | None]:
    """(splits, feature column names or None for text): per split, a CSV file with a header row: the `label` column
    and numeric feature columns, or the `text` column (--text; other columns are left out) as one string per example
    (the caller checks the split names: one file is split 'all', which --test_fraction splits). Without `text`, a
    CSV whose only column besides the label holds anything but numbers (in the first split's file) is read as text,
    and said so in the log. The feature names are kept in the staged metadata, so the export reads CSVs by them."""
    splits, header = {}, None
    for split, path in paths.items():  # One file after the other: a bad cell is named before the next file is read.
        rows = _read_split_rows(split, path, label, header)
        if header is None:
            header = rows[0]
            text = _text_column(path, rows, label, text)
        splits[split] = _split_columns(split, path, rows, label, text)
    return splits, None if text is not None else [name for name in header if name != label]


def _text_column(path: str, rows: list[list[str]], label: str, text: str | None) -> str | None:
    """The text column: `text` (checked), or the only column besides `label` when it holds anything but numbers;
    None for numeric feature columns."""
    header = rows[0]
    others = [name for name in header if name != label]
    if text is None and len(others) == 1 and not all(_is_number(row[header.index(others[0])]) for row in rows[1:]):
        text = others[0]
        log.info("--from_csv: column %r, the only one besides --label=%r, holds text: staged as a text dataset "
                 "(--text=%s says so explicitly).", text, label, text)
    elif text is not None:
        if text not in header or text == label:
            raise ConfigError(f"--text={text!r} is not a column of {path} besides --label={label!r} (columns: "
                              f"{header}); pass --text=<the column that holds the text>.")
        left_out = [name for name in others if name != text]
        if left_out:
            log.info("--from_csv: --text=%r: the columns %s are left out (the text task reads one text column).",
                     text, left_out)
    return text


def _split_columns(split: str, path: str, rows: list[list[str]], label: str, text: str | None) -> tuple:
    """(inputs, labels) of one split's rows: float feature vectors, or the `text` column's strings."""
    header = rows[0]
    used = [label, text] if text is not None else header
    index = header.index(label)
    values, labels = [], []
    for number, row in enumerate(rows[1:], start=2):
        empty = [name for name in used if not row[header.index(name)].strip()]
        if empty:
            raise ConfigError(f"{path}, line {number}: no value in column(s) {empty}. Fill the missing values in "
                              "or drop those rows (every example needs every column).")
        labels.append(row[index])
        if text is not None:
            values.append(row[header.index(text)])
            continue
        cells = [(name, cell) for position, (name, cell) in enumerate(zip(header, row, strict=True))
                 if position != index]
        try:
            values.append([float(cell) for _, cell in cells])
        except ValueError:
            name, cell = next((name, cell) for name, cell in cells if not _is_number(cell))
            raise ConfigError(f"{path}, line {number}: column {name!r} holds {cell!r}, not a number. Feature "
                              "columns must be numbers: drop or encode that column (or fix the value), or, if it "
                              f"is the text to classify, pass --text={name}.") from None
    if text is not None:
        return np.asarray(values, dtype=object), _label_array(labels)
    columns = (np.asarray(values, np.float32).reshape(len(values), len(header) - 1), _label_array(labels))
    check_finite(columns[0], f"--from_csv: {path}", split, [name for name in header if name != label], 2)
    check_finite(columns[1], f"--from_csv: {path}", split, [label], 2)
    return columns


def _read_split_rows(split: str, path: str, label: str, header: list[str] | None) -> list[list[str]]:
    """The rows of one split's CSV file, checked: it exists, has the `label` column, the other splits' `header` (when
    read already) and as many fields in every row as in its header."""
    import tensorflow as tf

    if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
        what = "a folder, not a file" if tf.io.gfile.exists(path) else "no such file"
        where = f"--from_csv={path!r}" if split == "all" else f"--from_csv: {split}={path!r}"
        raise ConfigError(f"{where}: {what}. Pass an existing CSV path (local or gs://), "
                          "e.g. --from_csv=train=train.csv,test=test.csv.")
    rows = _read_csv_rows(path)
    if not rows or label not in rows[0]:
        raise ConfigError(f"--label={label!r} is not a column of {path} (columns: {rows[0] if rows else []}); "
                          "pass --label=<the column to predict>.")
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
    try:
        return [row for row in csv.reader(io.StringIO(text, newline="")) if row]
    except csv.Error as error:
        raise ConfigError(f"--from_csv: {path} is not a readable CSV file ({error}): export it as CSV in UTF-8.") \
            from None


def _label_array(labels: list[str]) -> np.ndarray:
    """CSV label cells as ints, floats or strings, whichever all of them are."""
    for kind in (int, float):
        try:
            return np.asarray([kind(value) for value in labels])
        except ValueError:
            continue
    return np.asarray(labels)
