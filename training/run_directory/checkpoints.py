"""Checkpoints that survive damage: each one is read back before it counts, restored only after a full read, and
an older one is deleted only once a newer one has been read back intact.

Layout (what tf.train.CheckpointManager writes, so its readers and `tf.train.latest_checkpoint` work):
`ckpt-<step>.index`, `ckpt-<step>.data-<i>-of-<n>` and the `checkpoint` state file naming the newest.

Why not CheckpointManager itself: it deletes the oldest checkpoint inside `save()`, before anything has read the new
one, and it trusts the state file, so a damaged or missing state file or index made a run start from scratch and
rotate the intact older checkpoints away. Here the files on disk are the truth and the state file is rewritten from
them. "Intact" means the index and every data shard read back with matching checksums (TensorFlow checks each
tensor's crc32c on read) and every floating-point value is finite.
"""

import dataclasses
import logging
import re

import numpy as np
import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint_management

from common.errors import ConfigError, StorageError
from common.settings import require_int
from common.storage_errors import describe, transient
from common.storage_paths import join, list_folder
from common.storage_wait import reporting_on_gcs

log = logging.getLogger(__name__)

_FILE = re.compile(r"^ckpt-(\d+)\.(index|data-\d+-of-\d+)$")


@dataclasses.dataclass(frozen=True)
class Damaged:
    """A checkpoint that cannot be restored, and why."""

    path: str
    reason: str


def checkpoint_steps(directory: str) -> list[int]:
    """Steps of every checkpoint with at least one file (index or data shard) in `directory`, ascending."""
    try:
        try:
            names = list_folder(directory).files
        except tf.errors.NotFoundError:
            # TensorFlow's gs:// client says "Could not find directory" also when the bucket does not answer: a
            # run would start afresh beside its checkpoints. `exists` tells the two apart (it raises then).
            if not tf.io.gfile.exists(directory):
                return []
            raise
    except tf.errors.OpError as error:
        if not transient(error) and not isinstance(error, tf.errors.NotFoundError):
            raise
        raise StorageError(f"Listing the checkpoints in {directory} failed ({describe(error)}): nothing was changed. "
                           "Rerun the same command once the storage answers: the run resumes from them.") from error
    return sorted({int(match.group(1)) for match in map(_FILE.match, names) if match})


# Errors of the storage rather than of the file (gs:// outages, expired credentials, rate limits).
_UNANSWERED = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.PermissionDeniedError,
               tf.errors.UnauthenticatedError, tf.errors.ResourceExhaustedError, tf.errors.AbortedError)


def verify(prefix: str) -> str | None:
    """None if the checkpoint at `prefix` reads back whole and finite; else what is wrong with it (one line).

    A storage that does not answer (or refuses) is a StorageError, never "damaged": the caller would otherwise skip
    an intact checkpoint and resume from an older one, losing the steps in between."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for key in reader.get_variable_to_dtype_map():
            value = reader.get_tensor(key)  # Reads the bytes from the data shard and checks their crc32c.
            if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.all(np.isfinite(value)):
                return f"holds non-finite values ({key})"
    except _UNANSWERED as error:  # The storage failed, not the file: skipping it would resume from an older one.
        raise StorageError(f"Reading the checkpoint {prefix} failed ({describe(error)}): whether it is intact is "
                           "unknown, so nothing was changed. Check that the storage is reachable and readable "
                           "(e.g. `gcloud storage ls` the folder), then rerun: the run resumes from it.") from error
    except Exception as error:  # noqa: BLE001 - a damaged file fails in many ways (OpError, IndexError, ...).
        message = getattr(error, "message", None) or str(error)
        if isinstance(error, tf.errors.NotFoundError) or not tf.io.gfile.exists(prefix + ".index"):
            return "its .index file is missing"
        return f"unreadable ({type(error).__name__}: {' '.join(message.split())[:200]})"
    return None


class CheckpointStore:
    """Saves, verifies, rotates and finds the checkpoints of one run.

    `read_dir` is where checkpoints are restored from (the chief's); `write_dir` where this process saves (the
    same on the chief, a private folder on the other workers of a multi-worker job, which must save too).
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, *, read_dir: str, write_dir: str, keep: int,
                 options: tf.train.CheckpointOptions | None = None, verify_saves: bool = True):
        self.checkpoint = checkpoint
        self.read_dir = read_dir
        self.write_dir = write_dir
        self.keep = keep
        self.options = options
        self.verify_saves = verify_saves
        self._kept: list[int] = []  # Steps of the checkpoints this run keeps in write_dir, ascending.
        self.latest: str | None = None  # Newest checkpoint known intact (restored or written by this process).

    def path(self, step: int, directory: str | None = None) -> str:
        return join(directory or self.read_dir, f"ckpt-{step}")

    def has_files(self) -> bool:
        return bool(checkpoint_steps(self.read_dir))

    def newest_intact(self) -> tuple[str | None, list[Damaged]]:
        """The newest checkpoint in `read_dir` that verifies, and the newer ones that did not (newest first)."""
        damaged = []
        state = _read_state(self.read_dir)
        named = {int(path.rsplit("-", 1)[1]) for path in state if re.search(r"ckpt-\d+$", path)}
        for step in sorted(set(checkpoint_steps(self.read_dir)) | named, reverse=True):
            reason = verify(self.path(step))
            if reason is None:
                return self.path(step), damaged
            damaged.append(Damaged(self.path(step), reason))
        return None, damaged

    def find_restorable(self, *, writable: bool = True) -> str | None:
        """The checkpoint to resume from (None for a fresh run), after verifying it.

        Damaged newer checkpoints are skipped with a warning naming each. Checkpoint files without one intact
        checkpoint among them are a ConfigError: starting from scratch would silently throw the run away. When
        `writable`, the state file is rewritten to name the verified checkpoints, so CheckpointManager readers,
        TensorBoard and `tf.train.latest_checkpoint` agree with what is restored.
        """
        with reporting_on_gcs(f"the checkpoints in {self.read_dir} to be read back", self.read_dir):
            latest, damaged = self.newest_intact()
        for item in damaged:
            log.warning("Checkpoint %s is damaged (%s): skipped%s.", item.path, item.reason,
                        f"; resuming from the newest intact one, {latest}" if latest else "")
        if latest is None and damaged:
            raise ConfigError(f"{self.read_dir} holds checkpoint files but no intact checkpoint "
                              f"({'; '.join(f'{item.path}: {item.reason}' for item in damaged)}). Nothing was "
                              "changed. To start afresh, pass a new --model_dir (or delete that folder); to keep the "
                              "run, restore the files from a copy.")
        if latest is None:
            return None
        step = int(latest.rsplit("-", 1)[1])
        damaged_steps = {int(item.path.rsplit("-", 1)[1]) for item in damaged}
        self._kept = [kept for kept in checkpoint_steps(self.read_dir) if kept <= step and kept not in damaged_steps]
        self.latest = latest
        if writable and self.read_dir == self.write_dir and _read_state(self.read_dir)[:1] != [latest]:
            try:
                self._write_state()
                log.info("Checkpoint state file rewritten from the files present (newest intact: %s).", latest)
            except tf.errors.OpError as error:
                log.warning("Could not rewrite the checkpoint state file in %s (%s).", self.read_dir,
                            describe(error))
        return latest

    def save(self, step: int, *, before_commit=None) -> str:
        """Writes the checkpoint of `step`, reads it back, then names it in the state file and deletes the oldest
        beyond `keep`; returns its path. `before_commit()` runs in between and may raise: a run that lost its lock
        while the save was under way (frozen, then thawed) stops there, before touching another run's state file
        or checkpoints."""
        path = self.path(step, self.write_dir)
        with reporting_on_gcs(f"the checkpoint save to {path}", path):
            return self._save(step, path, before_commit)

    def _save(self, step: int, path: str, before_commit) -> str:
        try:
            self.checkpoint.save_counter  # noqa: B018 - created on first use; CheckpointManager's files hold it too.
            self.checkpoint.write(path, options=self.options)
            reason = verify(path) if self.verify_saves else None
            if reason is not None:
                raise StorageError(f"The checkpoint of step {step} was written to {path} but reads back damaged "
                                   f"({reason}). {self.previous_phrase()} Check the storage, then rerun.")
            if before_commit is not None:
                before_commit()
            kept = [kept for kept in self._kept if kept != step] + [step]
            self._kept, dropped = kept[-self.keep:], kept[:-self.keep]
            self._write_state()  # Names only the kept ones, then the oldest go: never before the new one read back.
            for old in dropped:
                self._delete(old)
        except tf.errors.OpError as error:
            raise StorageError(f"Saving the checkpoint of step {step} to {self.write_dir} failed ({describe(error)})."
                               f" {self.previous_phrase()}") from error
        self.latest = path
        return path

    def previous_phrase(self) -> str:
        """What is intact and how to resume, for the message of a failure."""
        if self.latest:
            return f"The previous checkpoint ({self.latest}) is intact: rerun the same command to resume from it."
        return "No earlier checkpoint of this run exists: a rerun starts from step 0."

    def _write_state(self) -> None:
        # The function CheckpointManager uses (relative paths, written to a temporary file and renamed); the public
        # tf.compat.v1 wrapper logs a deprecation warning on every call.
        paths = [self.path(step, self.write_dir) for step in self._kept]
        checkpoint_management.update_checkpoint_state_internal(self.write_dir, paths[-1], paths,
                                                               save_relative_paths=True)

    def _delete(self, step: int) -> None:
        for name in tf.io.gfile.glob(self.path(step, self.write_dir) + ".*"):
            tf.io.gfile.remove(name)


def named_steps(directory: str) -> list[int]:
    """Steps of the checkpoints the `checkpoint` state file names and whose files are present, ascending: the ones a
    run has read back intact (it names a checkpoint only then), e.g. for a sidecar evaluator to read."""
    present = set(checkpoint_steps(directory))
    named = {int(path.rsplit("-", 1)[1]) for path in _read_state(directory) if re.search(r"ckpt-\d+$", path)}
    return sorted(named & present)


def _read_state(directory: str) -> list[str]:
    """Paths the `checkpoint` state file names, newest first; [] if it is missing, empty or garbled."""
    try:
        state = tf.train.get_checkpoint_state(directory)
    except Exception:  # noqa: BLE001 - a garbled state file is exactly what this tolerates.
        return []
    if state is None or not state.model_checkpoint_path:
        return []
    return [state.model_checkpoint_path] + [path for path in reversed(state.all_model_checkpoint_paths)
                                            if path != state.model_checkpoint_path]


def check_settings(config) -> None:
    require_int("checkpoints_to_keep", config.checkpoints_to_keep, minimum=1, example=3)
