"""The run directory (`model_dir`, local or gs://) as docs/run_directory.md lays it out: every file name spelled
here once, the paths, the small files, and the run lock held while this process writes. I/O through tf.io.gfile,
except the small files on gs://, written through the run lock's fence (gcs/generation_fence.py).

  model_dir/
    checkpoints/            ckpt-<step>.index/.data-* + the `checkpoint` state file (checkpoints.py)
    run.lock                held by the run writing here (lock.py); gone after it exits
    run_identity.json       settings a resumed run (or a sidecar) must share (identity.py)
    operative_config.gin    the gin configuration actually used
    command.txt             the exact argv
    metrics.json            {"step": N, "train": {...}, "eval": {...}, "best": {...}}, rewritten after each eval
    metrics.jsonl           one record per loop and per evaluation (history.py)
    train/, eval/           TensorBoard event files (training/observers/summaries.py); hparams events in model_dir
    plugins/profile/        the PROFILE_STEPS trace (training/observers/profiling.py)
    best/                   the best checkpoint by BEST_METRIC, and best.json (best.py)
    eval_sidecar/           --mode=continuous_eval's records: its own metrics.jsonl, metrics.json, events and lock
    export/<step>/          SavedModel with a serving_default signature (export/best/: the best one)
"""

import contextlib
import json
import logging
import os
import shutil
import tempfile

import tensorflow as tf

from common.errors import ConfigError, StorageError
from common.storage_errors import describe, transient
from common.storage_paths import join
from training.run_directory import lock as run_lock
from training.run_directory.storage_guard import StorageGuard

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
IDENTITY = "run_identity.json"
OPERATIVE_CONFIG = "operative_config.gin"
COMMAND = "command.txt"
SUMMARY = "metrics.json"
HISTORY = "metrics.jsonl"
BEST = "best"
BEST_RECORD = "best/best.json"
EXPORT = "export"
SIDECAR = "eval_sidecar"  # The records of --mode=continuous_eval (training/controller.py).
TRAIN_EVENTS, EVAL_EVENTS = "train", "eval"  # TensorBoard folders of the training job's records.


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

    def folder(self, name: str) -> "RunDirectory":
        """The sub-folder `name` as a run directory of its own, sharing this one's guard (a sidecar's records)."""
        return RunDirectory(self.path(name), is_chief=self.is_chief, guard=self.guard)

    @contextlib.contextmanager
    def locked(self, *, optional: bool = False):
        """Holds this directory's run lock (lock.py) for the body, on the chief; yields whether this process may
        write. Every write asks the guard, which asks the lock: a gs:// lock can be lost mid-run. `optional`
        (--mode=eval): a directory held by a training run, or not writable, yields False (a warning) instead of
        exit 2."""
        lock = run_lock.make_lock(self.model_dir, storage_timeout_seconds=self.guard.timeout_seconds) \
            if self.is_chief else None
        if lock is not None:
            try:
                lock.acquire()
            except ConfigError as error:
                if not optional:
                    raise
                log.warning("%s Evaluating without recording metrics.json.", error)
                lock = None
        if lock is not None:
            self.guard.lock = lock
        try:
            yield lock is not None or not self.is_chief
        finally:
            if lock is not None:
                lock.release()

    def path(self, *parts: str) -> str:
        return join(self.model_dir, *parts)

    @property
    def checkpoint_dir(self) -> str:
        return self.path(CHECKPOINTS)

    @property
    def checkpoint_write_dir(self) -> str:
        """Where this process's checkpoints go: `checkpoint_dir` on the chief, a temporary folder elsewhere."""
        return self.checkpoint_dir if self.is_chief else self._scratch(CHECKPOINTS)

    @property
    def best_dir(self) -> str:
        """Where the best checkpoint goes (BEST_METRIC; training/run_directory/best.py): model_dir/best on the chief."""
        return self.path(BEST) if self.is_chief else self._scratch(BEST)

    def export_dir(self, step: int | str) -> str:
        return self.path(EXPORT, str(step)) if self.is_chief else self._scratch(EXPORT, str(step))

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
        self.write_json(SUMMARY, summary)


def _floats(values: dict) -> dict:
    return {key: float(value) for key, value in values.items()}
