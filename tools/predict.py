"""Predictions of an export for files you have: `python -m tools.predict --export=DIR --input=FILE_OR_FOLDER
[--output=out.csv|out.jsonl]`.

DIR is a local export/<step>/ (or export/best/) of a run. What --input may be follows from the export's
assets.extra/serving_metadata.json (tools/prediction_inputs.py): images (a file or a folder), a CSV of feature rows, a
text file of lines, a .npy batch or a Vertex AI request .json. Without --output the predictions are printed as CSV: one
row per example with its key (file, line or text; for data staged with --id_column, the row's id, in a column named
as in the CSV), every per-example output (class names, class ids; predictions) and, for classifiers, the probability
of the predicted class. A .jsonl output holds every output, probabilities and logits included. Bad flags or input
(NaN or infinite features among them) exit 2 with one `error:` line; the flags, the export and the input files (all
but images) are checked before TensorFlow is imported.
"""

import argparse
import csv
import io
import json
import os
import sys

import numpy as np

from common.errors import ConfigError, user_message
from serving import metadata
from tools import prediction_inputs as inputs

BATCH_SIZE = 256  # Examples per call of the signature.
OUTPUT_SUFFIXES = (".csv", ".jsonl")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.predict", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", required=True, help="a local export folder, e.g. runs/default/export/1000")
    parser.add_argument("--input", required=True, help="an image file or folder, a .csv, a text file, a .npy or a "
                                                       ".json request, as the export's task takes")
    parser.add_argument("--output", default=None, help="write the predictions to this .csv or .jsonl file (default: "
                                                       "print CSV)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Runs the command line `argv` (without the program name); returns the exit code."""
    args = parse_args(argv)
    try:
        if args.output is not None and not args.output.lower().endswith(OUTPUT_SUFFIXES):
            raise ConfigError(f"--output={args.output} must end in .csv or .jsonl.")
        if args.output is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
            raise ConfigError(f"--output={args.output}: the folder {os.path.dirname(os.path.abspath(args.output))} "
                              "does not exist; create it or pass a path in a folder that exists.")
        described = _read_metadata(args.export)
        key, labels, batch = inputs.read(args.input, described)
        outputs = predict(args.export, batch)
    except ConfigError as error:
        print(f"error: {user_message(error)}", file=sys.stderr, flush=True)
        return error.exit_code
    records = [{key: label, **{name: _plain(values[index]) for name, values in outputs.items()}}
               for index, label in enumerate(labels)]
    if args.output is None:
        sys.stdout.write(_csv_text(records))
    else:
        with open(args.output, "w", newline="", encoding="utf-8") as handle:
            handle.write(_csv_text(records) if args.output.lower().endswith(".csv") else
                         "".join(json.dumps(record) + "\n" for record in records))
        print(f"Wrote {len(records)} predictions to {args.output}.", file=sys.stderr)
    return 0


def _read_metadata(export_dir: str) -> dict:
    if export_dir.startswith("gs://"):
        raise ConfigError(f"--export={export_dir}: predict reads a local export; copy it first, e.g. gcloud storage "
                          f"cp -r {export_dir} .")
    try:
        return metadata.read_local(export_dir)
    except FileNotFoundError as error:
        raise ConfigError(f"--export={export_dir} is not an export of this template ({error}); pass a run's "
                          "export/<step>/ or export/best/ (an export written before serving_metadata.json existed: "
                          "rerun train.py --mode=export on its run).") from None
    except ValueError as error:
        raise ConfigError(f"--export={export_dir}: {error}; rerun train.py --mode=export on its run.") from None


def predict(export_dir: str, batch: dict) -> dict:
    """{output name: array [n, ...]} of the export's serving_default signature for `batch`, BATCH_SIZE at a time."""
    from common.tf_logging import quiet_tensorflow  # Before TensorFlow loads: its C++ start-up lines off.

    quiet_tensorflow()
    import tensorflow as tf

    serve = tf.saved_model.load(export_dir).signatures[metadata.SIGNATURE]
    parts = []
    for chunk in _chunks(batch):
        try:
            result = serve(**{name: tf.constant(values) for name, values in chunk.items()})
        except (tf.errors.InvalidArgumentError, TypeError, ValueError) as error:
            message = error.message if isinstance(error, tf.errors.OpError) else str(error)
            raise ConfigError(f"The export refused the input: {' '.join(message.split())[:300]}") from None
        parts.append({name: value.numpy() for name, value in result.items()})
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _chunks(batch: dict):
    """`batch` BATCH_SIZE examples at a time; an input given as a list (images of different sizes, for an export that
    resizes them) is sent as runs of consecutive images of one size, stacked (a batch is one tensor)."""
    count = len(next(iter(batch.values())))
    start = 0
    while start < count:
        end = min(start + BATCH_SIZE, count)
        for values in batch.values():
            if isinstance(values, list):
                end = next((index for index in range(start + 1, end) if values[index].shape != values[start].shape),
                           end)
        yield {name: np.stack(values[start:end]) if isinstance(values, list) else values[start:end]
               for name, values in batch.items()}
        start = end


def _plain(value):
    """A JSON value for one output of one example: text for bytes; float32 at its own (shortest) precision."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        return [_plain(item) for item in value]
    if isinstance(value, np.floating):
        return float(str(value))
    return value.item() if isinstance(value, np.generic) else value


def _csv_text(records: list[dict]) -> str:
    """One row per record: its key (the input, or its id), every per-example scalar, and `probability` of the
    predicted class."""
    key = next(iter(records[0]))
    names = [key] + sorted(name for name, value in records[0].items() if name != key and not isinstance(value, list))
    with_probability = "classes" in records[0] and "probabilities" in records[0]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names + (["probability"] if with_probability else []))
    for record in records:
        row = [record[name] for name in names]
        writer.writerow(row + ([record["probabilities"][record["classes"]]] if with_probability else []))
    return out.getvalue()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
