"""LiteRT (TensorFlow Lite): `model.tflite` beside the SavedModel, converted from the same serving function.

It has the SavedModel's inputs and its numeric outputs only (logits, probabilities, classes; predictions): a string
output (class names, a `tf.gather` on a string constant) converts but fails when the interpreter runs it, so a
classifier's class names are written beside it as `labels.txt`, one per line in class-id order (line i names class
i, as TFLite's metadata conventions for labels have it), and are in assets.extra/serving_metadata.json. Only TFLite's
builtin ops are allowed, so the file runs in any LiteRT interpreter without the Flex (TensorFlow ops) delegate. A
graph that needs other ops (the text task's tokenizer: string ops, and `tf.searchsorted`, which is not even a Flex
op) does not convert: the export says so in one line and is complete without model.tflite.
An export that takes images of any size converts as it is (height and width of any size per call), or, with
`experiment.export_tflite_image_size=(H, W)`, at that one input size, which accelerator delegates need.
"""

import contextlib
import logging
import os
import re
import sys

import tensorflow as tf

from common.errors import ConfigError
from common.settings import how_to_set
from common.storage_paths import join

log = logging.getLogger(__name__)

FILE_NAME = "model.tflite"
LABELS_FILE_NAME = "labels.txt"


def check_image_size(value, example: str):
    """experiment.export_tflite_image_size: None or (height, width), whole numbers >= 1, as a tuple; a ConfigError
    ending with `example` (how to set it) otherwise."""
    if value is None:
        return None
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and
            all(isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in value)):
        raise ConfigError(f"experiment.export_tflite_image_size={value!r} must be None or (height, width), two whole "
                          f"numbers >= 1: the input size of model.tflite for an export that takes images of any "
                          f"size; e.g. {example}.")
    return tuple(value)


def signature_at(signature: dict, image_size: tuple[int, int] | None) -> dict:
    """`signature` with its any-size image inputs ([batch, None, None, C]) fixed to `image_size` (H, W); unchanged
    when it is None or the inputs have a size already (then it does not apply, and a log line says so)."""
    if image_size is None:
        return signature
    fixed = {}
    for name, spec in signature.items():
        shape = spec.shape.as_list()
        resizable = len(shape) == 4 and shape[1] is None and shape[2] is None
        fixed[name] = tf.TensorSpec([shape[0], *image_size, shape[3]], spec.dtype, name=spec.name) if resizable else \
            spec
    if fixed == signature:
        log.warning("experiment.export_tflite_image_size=%s applies to exports that take images of any size; this "
                    "one takes %s: model.tflite keeps them.", image_size,
                    {name: spec.shape.as_list() for name, spec in signature.items()})
    return fixed


def write(folder: str, serve, signature: dict, outputs: dict, variables: list, *,
          image_size: tuple[int, int] | None = None, class_names: list[str] | None = None) -> dict:
    """Writes folder/model.tflite (at `image_size`, see signature_at) and, for a classifier, folder/labels.txt if the
    serving graph converts; returns what the export's metadata says of them (serving/metadata.py)."""
    signature = signature_at(signature, image_size)
    try:
        content = convert(serve, signature, variables)
    except NotConvertible as error:
        log.warning("%s not written: %s in this task's serving graph; the SavedModel export is complete "
                    "(docs/serving.md, LiteRT).", FILE_NAME, error)
        return {"file": None, "reason": str(error)}
    with tf.io.gfile.GFile(join(folder, FILE_NAME), "wb") as handle:
        handle.write(content)
    described = {"file": FILE_NAME, "outputs": sorted(name for name, spec in outputs.items()
                                                      if spec.dtype != tf.string),
                 "inputs": {name: [None if size is None else int(size) for size in spec.shape]
                            for name, spec in signature.items()}}
    if class_names:
        with tf.io.gfile.GFile(join(folder, LABELS_FILE_NAME), "w") as handle:
            handle.write("".join(f"{name}\n" for name in class_names))
        described["labels"] = LABELS_FILE_NAME
    return described


class NotConvertible(Exception):
    """The serving graph does not convert to builtin TFLite ops; the message names the ops that do not."""


def convert(serve, signature: dict, variables: list) -> bytes:
    """The .tflite bytes of `serve` (a Python function of the signature's inputs by name -> {name: tensor}) without
    its string outputs; `variables` are the tf.Variables it reads (frozen into the file as constants)."""
    def numeric(**inputs):
        return {name: value for name, value in serve(**inputs).items() if value.dtype != tf.string}

    concrete = tf.function(numeric).get_concrete_function(**signature)
    # The converter freezes the variables reachable from this object; a Keras 3 model alone exposes none of its
    # underlying tf.Variables this way, and the frozen graph then reads uninitialised memory (NaN outputs).
    holder = tf.Module()
    holder.frozen = list(variables)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    try:
        with _native_stderr_dropped():
            return converter.convert()
    except Exception as error:  # noqa: BLE001 - the converter raises ConverterError and others, with MLIR dumps.
        log.debug("The TFLite converter failed: %s", error)
        ops = sorted(set(re.findall(r"'tf\.(\w+)' op is neither a custom op nor a flex op", str(error))))
        reason = (f"TensorFlow Lite has no builtin op for {', '.join(ops)}" if ops else
                  f"the converter failed ({type(error).__name__}: {_first_line(error)})")
        raise NotConvertible(reason) from error


@contextlib.contextmanager
def _native_stderr_dropped():
    """Drops what is written to the process's stderr (file descriptor 2) for the conversion's second: the
    converter's C++ code prints its diagnostics there (a few hundred MLIR lines for one op it lacks, and warnings
    about flags it ignores), which would bury the one line that says what happened; the exception carries them too
    (logged at DEBUG)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:200] if lines else "no message"


def check_settings(config) -> dict:
    """experiment.export_tflite (True or False) and experiment.export_tflite_image_size."""
    if not isinstance(config.export_tflite, bool):
        raise ConfigError(f"experiment.export_tflite={config.export_tflite!r} must be True or False; e.g. "
                          f"{how_to_set('export_tflite', True)}.")
    return {"export_tflite_image_size": check_image_size(config.export_tflite_image_size,
                                                         how_to_set("export_tflite_image_size", (224, 224)))}
