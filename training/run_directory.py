"""The run directory (`model_dir`, local or gs://) as the contract lays it out; all I/O through tf.io.gfile.

  model_dir/
    checkpoints/            tf.train.CheckpointManager (the last `checkpoints_to_keep`)
    run_identity.json       settings a resumed run must share (GLOBAL_BATCH_SIZE, SEED, MODEL, DATASET)
    operative_config.gin    the gin configuration actually used
    command.txt             the exact argv
    metrics.json            {"step": N, "train": {...}, "eval": {...}}, rewritten after each eval
    train/, eval/           TensorBoard event files
    export/<step>/          SavedModel with a serving_default signature
"""

import json
import logging
import os
import shutil
import tempfile

import tensorflow as tf

from training.errors import ConfigError, StorageError

log = logging.getLogger(__name__)


class RunDirectory:
    """Paths and small files of one run. Only the chief writes (`is_chief=False` makes every write a no-op).

    The other workers of a multi-worker job must still save checkpoints and exports (saving takes part in
    collectives, and a worker that skips it can deadlock the job): they write to a private local temporary folder
    instead (`checkpoint_write_dir`, `export_dir`), which `cleanup()` removes.
    """

    def __init__(self, model_dir: str, *, is_chief: bool = True):
        self.model_dir = model_dir
        self.is_chief = is_chief
        self._scratch_dir = None

    def path(self, *parts: str) -> str:
        return tf.io.gfile.join(self.model_dir, *parts)  # Also right for gs:// URLs.

    @property
    def checkpoint_dir(self) -> str:
        return self.path("checkpoints")

    @property
    def checkpoint_write_dir(self) -> str:
        """Where this process's checkpoints go: `checkpoint_dir` on the chief, a temporary folder elsewhere."""
        return self.checkpoint_dir if self.is_chief else self._scratch("checkpoints")

    def export_dir(self, step: int) -> str:
        return self.path("export", str(step)) if self.is_chief else self._scratch("export", str(step))

    def _scratch(self, *parts: str) -> str:
        if self._scratch_dir is None:
            self._scratch_dir = tempfile.mkdtemp(prefix="non-chief-worker-")
            log.info("Not the chief: this worker saves to %s (removed at exit); the chief writes %s.",
                     self._scratch_dir, self.model_dir)
        return os.path.join(self._scratch_dir, *parts)

    def cleanup(self) -> None:
        """Removes a non-chief worker's temporary folder (a no-op on the chief)."""
        if self._scratch_dir is not None:
            shutil.rmtree(self._scratch_dir, ignore_errors=True)
            self._scratch_dir = None

    def write_text(self, name: str, text: str) -> None:
        if not self.is_chief:
            return
        temporary = self.path(f".{name}.tmp")
        try:
            tf.io.gfile.makedirs(self.model_dir)
            with tf.io.gfile.GFile(temporary, "w") as handle:
                handle.write(text)
            tf.io.gfile.rename(temporary, self.path(name), overwrite=True)  # Readers never see a half-written file.
        except tf.errors.OpError as error:
            raise StorageError(f"Writing {self.path(name)} failed ({type(error).__name__}: "
                               f"{' '.join(error.message.split())[:300]}). Checkpoints written before are intact: "
                               "rerun the same command to resume once the storage is reachable.") from error

    def read_json(self, name: str) -> dict | None:
        if not tf.io.gfile.exists(self.path(name)):
            return None
        with tf.io.gfile.GFile(self.path(name)) as handle:
            return json.load(handle)

    def write_json(self, name: str, value: dict) -> None:
        self.write_text(name, json.dumps(value, indent=2, sort_keys=True) + "\n")

    def check_identity(self, identity: dict, *, has_checkpoint: bool) -> None:
        """Refuses to resume a checkpoint written with other data-order or model settings; records them otherwise."""
        previous = self.read_json("run_identity.json")
        if has_checkpoint and previous is not None:
            changed = {key: (previous.get(key), value) for key, value in identity.items() if previous.get(key) != value}
            if changed:
                details = ", ".join(f"{key}: checkpoint {old!r}, now {new!r}" for key, (old, new) in changed.items())
                raise ConfigError(f"{self.model_dir} holds a checkpoint of a different run ({details}). Resuming "
                                  "would break the data order or the weights: restore the old values, or pass a new "
                                  "--model_dir to start afresh.")
        if previous != identity:
            self.write_json("run_identity.json", identity)

    def write_metrics(self, step: int, train: dict, evaluation: dict) -> None:
        self.write_json("metrics.json", {"step": step, "train": _floats(train), "eval": _floats(evaluation)})


def _floats(values: dict) -> dict:
    return {key: float(value) for key, value in values.items()}
