"""Short real training runs of each shipped task, exported as train.py exports them, for tests/test_serving.py and
tests/test_predict.py (one per task per session: the `served` fixture in conftest.py)."""

import dataclasses
import logging
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from helpers import shipped_config

SAVED_MODEL_CLI = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")

# Each shipped task's config, shrunk to 20 steps; the tabular classifier also keeps export/best/.
CONFIGS = {
    "image": ("configs/default.gin", []),
    "tabular": ("configs/experiments/breast_cancer_mlp.gin", ["BEST_METRIC='eval/accuracy'", "EVAL_EVERY=10"]),
    "regression": ("configs/experiments/synthetic_housing_mlp.gin", []),
    "text": ("configs/experiments/synthetic_reviews_transformer.gin", []),
}
STEPS = 20
SHRUNK = [f"TRAIN_STEPS={STEPS}", "STEPS_PER_LOOP=10", "EVAL_EVERY=20", "CHECKPOINT_EVERY=20", "STRATEGY='default'",
          "cosine.warmup_steps=5", "experiment.export_tflite=True"]


@dataclasses.dataclass
class ServedRun:
    name: str
    gin_file: str
    params: list
    trainer: object  # The training-time Trainer: its model is what every export must reproduce.
    model_dir: str
    export_logs: list  # The messages training/run_directory/export.py and serving/tflite.py logged.

    @property
    def export_dir(self) -> str:
        return os.path.join(self.model_dir, "export", str(STEPS))

    def eval_inputs(self, count: int = 16) -> dict:
        """The first `count` eval examples as a client sends them, read straight from TFDS (not through serving/)."""
        trainer = self.trainer
        split = tfds.as_numpy(trainer.builder.as_dataset(split=trainer.dataset_spec.eval_split, batch_size=-1))
        key = {"image": "image", "text": "text"}.get(self.name, "features")
        name = {"image": "images"}.get(self.name, key)
        return {name: split[key][:count]}

    def expected(self, inputs: dict) -> dict:
        """The training-time model's serving outputs for raw `inputs` (eager, in this process)."""
        outputs = self.trainer.task.serve(self.trainer.model, {name: tf.constant(value) for name, value in
                                                               inputs.items()})
        return {name: value.numpy() for name, value in outputs.items()}


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def train_and_export(name: str, model_dir: str, data_dir: str) -> ServedRun:
    import gin

    from tpu_utils.strategy import make_strategy
    from training.controller import Controller
    from training.run_directory.layout import RunDirectory
    from training.run_directory.record import RunRecord
    from training.trainer import Trainer

    gin_file, extra = CONFIGS[name]
    params = [*SHRUNK, *extra, f"DATA_DIR='{data_dir}'"]
    config = shipped_config(gin_file, *params)
    collect = _Collect()
    loggers = [logging.getLogger("training.run_directory.export"), logging.getLogger("serving.tflite")]
    for logger in loggers:
        logger.addHandler(collect)
    try:
        trainer = Trainer(config, make_strategy("default"))
        controller = Controller(trainer, RunRecord(trainer, RunDirectory(model_dir)))
        controller.record.restore()
        controller.train_and_evaluate()
    finally:
        for logger in loggers:
            logger.removeHandler(collect)
        gin.clear_config()
    return ServedRun(name, gin_file, params, trainer, model_dir, collect.messages)


def relative_difference(got: np.ndarray, expected: np.ndarray) -> float:
    """max|a - b| / max|b| (docs/correctness.md, replica invariance: the contract's measure), 0 for two zero tensors."""
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    difference = float(np.max(np.abs(got.astype(np.float64) - expected))) if expected.size else 0.0
    return difference / scale if scale else difference


def assert_same_outputs(got: dict, expected: dict, tolerance: float = 1e-5) -> None:
    """Float outputs within `tolerance` (relative), everything else (class ids, class names) equal."""
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        value, other = np.asarray(value), np.asarray(got[name])
        assert other.shape == value.shape, (name, other.shape, value.shape)
        if value.dtype.kind == "f":
            assert relative_difference(other, value) <= tolerance, (name, relative_difference(other, value))
        else:
            np.testing.assert_array_equal(other, value, err_msg=name)


def saved_model_cli_run(export_dir: str, inputs: dict, tmp_path) -> subprocess.CompletedProcess:
    """`saved_model_cli run` on `export_dir` with each input from a .npy file (strings: an array of bytes objects);
    the outputs land in tmp_path/out/<name>.npy."""
    flags = []
    for name, value in inputs.items():
        np.save(tmp_path / f"{name}.npy", value, allow_pickle=True)
        flags.append(f"{name}={tmp_path / f'{name}.npy'}")
    return subprocess.run([SAVED_MODEL_CLI, "run", "--dir", export_dir, "--tag_set", "serve", "--signature_def",
                           "serving_default", "--inputs", ";".join(flags), "--outdir", str(tmp_path / "out"),
                           "--overwrite"], capture_output=True, text=True, timeout=180)


def cli_outputs(tmp_path, names) -> dict:
    return {name: np.load(tmp_path / "out" / f"{name}.npy", allow_pickle=True) for name in names}


def loaded_outputs(export_dir: str, inputs: dict) -> dict:
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    return {name: value.numpy() for name, value in serve(**{k: tf.constant(v) for k, v in inputs.items()}).items()}
