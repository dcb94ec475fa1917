"""The run directory (`model_dir`, local or gs://) as docs/run_directory.md lays it out; I/O through tf.io.gfile,
except the small files on gs://, written through the run lock's fence (gcs/generation_fence.py).

  model_dir/
    checkpoints/            ckpt-<step>.index/.data-* + the `checkpoint` state file (checkpoints.py)
    run.lock                held by the run writing here (training/run_directory/lock.py); gone after it exits
    run_identity.json       settings a resumed run must share (training/run_directory/identity.py)
    operative_config.gin    the gin configuration actually used
    command.txt             the exact argv
    metrics.json            {"step": N, "train": {...}, "eval": {...}, "best": {...}}, rewritten after each eval
    metrics.jsonl           one record per loop and per evaluation (training/run_directory/history.py)
    train/, eval/           TensorBoard event files (training/observers/summaries.py); hparams events in model_dir
    itself plugins/profile/        the PROFILE_STEPS trace (training/observers/profiling.py)
    best/                   the best checkpoint by BEST_METRIC, and best.json (training/run_directory/best.py)
    eval_sidecar/           --mode=continuous_eval's ledger, events and lock (training/continuous_eval.py)
    export/<step>/          SavedModel with a serving_default signature (export/best/: the best one)
"""

import json
import logging
import os
import shutil
import tempfile

import tensorflow as tf

from common.errors import ConfigError, StorageError
from common.storage_errors import describe, transient
from common.storage_paths import join
from training.run_directory.storage_guard import StorageGuard

log = logging.getLogger(__name__)


def temporary_name(name: str) -> str:
    """What a small file `name` is written as before it is renamed into place (a kill may leave it behind:
    training/run_directory/leftovers.py removes it)."""
    return f".{name}.tmp"


class RunDirectory:
    """Paths and small files of one run. Only the chief writes (`is_chief=False` makes every write a no-op).

    The other workers of a multi-worker job must still save checkpoints and exports (saving takes part in
    collectives, and a worker that skips it can deadlock the job): they write to a private local temporary folder
    instead (`checkpoint_write_dir`, `export_dir`), which `cleanup()` removes.

    `guard` (training/run_directory/storage_guard.py) is asked before every write: the run lock still held, the storage
    not failing for longer than `storage_timeout_seconds`.
    """

    def __init__(self, model_dir: str, *, is_chief: bool = True, guard: StorageGuard | None = None):
        self.model_dir = model_dir
        self.is_chief = is_chief
        self.guard = guard or StorageGuard()
        self._scratch_dir = None

    def path(self, *parts: str) -> str:
        return join(self.model_dir, *parts)

    @property
    def checkpoint_dir(self) -> str:
        return self.path("checkpoints")

    @property
    def checkpoint_write_dir(self) -> str:
        """Where this process's checkpoints go: `checkpoint_dir` on the chief, a temporary folder elsewhere."""
        return self.checkpoint_dir if self.is_chief else self._scratch("checkpoints")

    @property
    def best_dir(self) -> str:
        """Where the best checkpoint goes (BEST_METRIC; training/run_directory/best.py): model_dir/best on the chief."""
        return self.path("best") if self.is_chief else self._scratch("best")

    def export_dir(self, step: int | str) -> str:
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

    def write_text(self, name: str, text: str, *, retry: bool = True) -> None:
        """Writes model_dir/`name` whole (a temporary file renamed over it; on gs:// under the run lock one upload
        the storage refuses once the lock is another run's); a failing storage is retried for the guard's timeout
        (`retry=False`: one attempt, for callers that retry themselves)."""
        if not self.is_chief:
            return
        folder, _, base = name.rpartition("/")  # `name` may be in a subfolder, e.g. 'best/best.json'.
        temporary = self.path(folder, temporary_name(base))

        def attempt():
            fence = self.guard.fenced(self.path(name))
            if fence is not None:  # gs:// under the run lock: one upload, refused once the lock is another run's.
                fence.write(self.path(name), text)
                return
            try:
                tf.io.gfile.makedirs(self.path(folder) if folder else self.model_dir)
                with tf.io.gfile.GFile(temporary, "w") as handle:
                    handle.write(text)
                tf.io.gfile.rename(temporary, self.path(name), overwrite=True)  # Readers never see half a file.
            except tf.errors.OpError as error:
                raise StorageError(f"Writing {self.path(name)} failed ({describe(error)}). Checkpoints saved before "
                                   "it are intact (if any): rerun the same command once the storage is fixed.") \
                    from error

        if retry:
            self.guard.retry(f"writing {self.path(name)}", attempt)
        else:
            self.guard.check()
            attempt()

    def read_json(self, name: str) -> dict | None:
        """The JSON object in model_dir/`name`, None if there is no such file; a ConfigError if it is corrupt."""
        path = self.path(name)
        try:
            if not tf.io.gfile.exists(path):
                return None
            with tf.io.gfile.GFile(path) as handle:
                value = json.load(handle)
        except (ValueError, UnicodeDecodeError) as error:
            raise ConfigError(f"{path} is corrupt (not JSON: {error}). It is rewritten by the run: delete it (or "
                              "restore it from a copy), then rerun.") from error
        except tf.errors.OpError as error:
            if transient(error):  # The storage did not answer: a rerun can succeed (exit 6), not bad input.
                raise StorageError(f"{path} cannot be read ({describe(error)}). Nothing was written: rerun the same "
                                   "command once the storage answers.") from error
            raise ConfigError(f"{path} cannot be read ({describe(error)}).") from error
        if not isinstance(value, dict):
            raise ConfigError(f"{path} is corrupt (a JSON {type(value).__name__}, not an object): delete it (or "
                              "restore it from a copy), then rerun.")
        return value

    def write_json(self, name: str, value: dict) -> None:
        self.write_text(name, json.dumps(value, indent=2, sort_keys=True) + "\n")

    def write_metrics(self, step: int, train: dict, evaluation: dict, best: dict | None = None) -> None:
        summary = {"step": step, "train": _floats(train), "eval": _floats(evaluation)}
        if best is not None:  # The best evaluation so far (training/run_directory/history.py).
            summary["best"] = best
        self.write_json("metrics.json", summary)


def _floats(values: dict) -> dict:
    return {key: float(value) for key, value in values.items()}
