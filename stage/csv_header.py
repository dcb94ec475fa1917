"""A CSV file's header row and what `python -m stage --from_csv` does with its columns: which column is the
label (--label), the text (--text), the id (--id_column) and which are dropped (--drop_columns); the rest are the
features. Standard library only: stage/flag_checks.py checks a local file's header with it before TensorFlow is
imported (a --label typo answers in a fraction of a second), and stage/csv_source.py checks every file it reads
(gs:// ones too) with the same function.
"""

import csv
import io

from common.errors import ConfigError

# Python's csv module refuses a field over 128 KiB by default ("field larger than field limit"); a text cell (a long
# review, a document) may be larger, and the whole file is in memory anyway.
FIELD_SIZE_LIMIT = 2**31 - 1


def parse_rows(text: str, path: str) -> list[list[str]]:
    """The non-empty rows of CSV `text` (read from `path`); a ConfigError naming the file and the row when the csv
    module cannot parse it (e.g. a NUL byte)."""
    csv.field_size_limit(FIELD_SIZE_LIMIT)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return [row for row in reader if row]
    except csv.Error as error:
        raise ConfigError(f"--from_csv: {path}, line {reader.line_num}: not a readable CSV row ({error}); fix that "
                          "line (or save the file again as CSV from the program that made it).") from None


def read_local_header(path: str) -> list[str] | None:
    """The first non-empty row of the local CSV file `path`; None when it does not decode as UTF-8 or parse (the
    reader names that, with the fix, when it reads the whole file)."""
    csv.field_size_limit(FIELD_SIZE_LIMIT)
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            return next((row for row in csv.reader(handle) if row), [])
    except (UnicodeDecodeError, csv.Error, OSError):
        return None


def split_list(value: str | None) -> list[str]:
    """'a, b' -> ['a', 'b'] (--drop_columns)."""
    return [name.strip() for name in (value or "").split(",") if name.strip()]


def feature_columns(header: list[str], path: str, label: str, *, text: str | None = None,
                    id_column: str | None = None, drop_columns: list[str] = ()) -> list[str]:
    """The feature columns of `header` (every column but the label, the id, the dropped ones and, with `text`, the
    text), after checking that the header names each column once and holds every column the flags name; a
    ConfigError naming the column and the fix otherwise."""
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise ConfigError(f"--from_csv: {path}: the header names the column(s) {repeated} more than once (columns: "
                          f"{header}); give every column its own name (a column read by name must be one column).")
    if label not in header:
        raise ConfigError(f"--label={label!r} is not a column of {path} (columns: {header}); pass --label=<the column "
                          "to predict>.")
    if text is not None and (text not in header or text == label or text in drop_columns):
        raise ConfigError(f"--text={text!r} is not a column of {path} besides --label={label!r} and --drop_columns "
                          f"(columns: {header}); pass --text=<the column that holds the text>.")
    named = [("--id_column", id_column)] if id_column is not None else []
    named += [("--drop_columns", name) for name in drop_columns]
    for flag, name in named:
        if name not in header:
            raise ConfigError(f"{flag}: {name!r} is not a column of {path} (columns: {header}); name a column of its "
                              "header row.")
        if name == label:
            role = "the id" if flag == "--id_column" else "dropped"
            raise ConfigError(f"{flag}: {name!r} is the --label column; the label cannot also be {role}.")
    if id_column is not None and id_column in drop_columns:
        raise ConfigError(f"--id_column={id_column} and --drop_columns both name {id_column!r}: an id column is left "
                          "out of the features already; pass it to one of them.")
    left_out = {label, id_column, *drop_columns}
    return [name for name in header if name not in left_out]
