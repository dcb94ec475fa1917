"""The export's own description, `assets.extra/serving_metadata.json`: what a reader needs to use the SavedModel
without TensorFlow (the task and its kind, each input's and output's dtype and shape, class names, a tabular task's
feature names, whether model.tflite was written and which outputs it has). `python -m tools.predict` decides how
to read its input files from it, before it imports TensorFlow.

TF Serving and Vertex AI ignore it (they read the SavedModel's signature); a file in assets.extra is never loaded
into the graph.
"""

import json
import os

FOLDER = "assets.extra"  # TF Serving's folder for files beside the SavedModel (warmup requests, ...).
FILE_NAME = "serving_metadata.json"
FORMAT_VERSION = 1
SIGNATURE = "serving_default"


def tensor_description(spec) -> dict:
    """{'dtype': 'uint8', 'shape': [None, 8, 8, 1]} of a tf.TensorSpec (None: any size, e.g. the batch)."""
    return {"dtype": spec.dtype.name, "shape": [None if size is None else int(size) for size in spec.shape]}


def describe(task_metadata: dict, inputs: dict, outputs: dict, *, tflite: dict | None = None) -> dict:
    """The metadata of an export: `task_metadata` (Task.serving_metadata), the signature's `inputs` and `outputs`
    ({name: tf.TensorSpec}) and, when model.tflite was asked for, what became of it (serving/tflite.py)."""
    described = {"format_version": FORMAT_VERSION, "signature": SIGNATURE, **task_metadata,
                 "inputs": {name: tensor_description(spec) for name, spec in sorted(inputs.items())},
                 "outputs": {name: tensor_description(spec) for name, spec in sorted(outputs.items())}}
    if tflite is not None:
        described["tflite"] = tflite
    return described


def path_in(export_dir: str) -> str:
    return f"{export_dir.rstrip('/')}/{FOLDER}/{FILE_NAME}"


def read_local(export_dir: str) -> dict:
    """The metadata of a local export; FileNotFoundError if the folder is no export of this template, ValueError if
    the file is not the JSON this module writes."""
    if not os.path.isfile(os.path.join(export_dir, "saved_model.pb")):
        raise FileNotFoundError(f"{export_dir} holds no saved_model.pb")
    path = path_in(export_dir)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{export_dir} has no {FOLDER}/{FILE_NAME}")
    with open(path) as handle:
        try:
            described = json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not JSON ({error})") from None
    if not isinstance(described, dict) or described.get("format_version") != FORMAT_VERSION or \
            not isinstance(described.get("inputs"), dict):
        raise ValueError(f"{path} is not serving metadata of format_version {FORMAT_VERSION}")
    return described
