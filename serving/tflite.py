"""LiteRT (TensorFlow Lite): `model.tflite` beside the SavedModel, converted from the same serving function.

It has the SavedModel's inputs and its numeric outputs only (logits, probabilities, classes; predictions): a string
output (class names, a `tf.gather` on a string constant) converts but fails when the interpreter runs it, so class
names are in assets.extra/serving_metadata.json (`class_names`, indexed by `classes`). Only TFLite's builtin ops are
allowed, so the file runs in any LiteRT interpreter without the Flex (TensorFlow ops) delegate. A graph that needs
other ops (the text task's tokenizer: string ops, and `tf.searchsorted`, which is not even a Flex op) does not
convert: the export says so in one line and is complete without model.tflite.
"""

import contextlib
import logging
import os
import re
import sys

import tensorflow as tf

log = logging.getLogger(__name__)

FILE_NAME = "model.tflite"


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
