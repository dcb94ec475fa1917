"""One writer per model_dir: `model_dir/run.lock`, taken before anything is written and released at exit.

The lock records the holder's host, pid and start time (lock_holder.py). A second run on the same model_dir stops
with exit 2 naming the holder. Multi-worker jobs: the chief holds it (the other workers write nothing there).
- Local (or NFS) folders: an exclusive `fcntl.flock` on the lock file. The kernel releases it when the holder dies,
  even by SIGKILL, so a lock left by a dead process is taken over at once (with a warning naming it).
- gs://: an object with a heartbeat (gcs/run_lock.py); taken over once stale, waited for while its
  heartbeat has stopped but is not stale yet; its holder stops writing (exit 6) once it may have been taken over.
"""

import contextlib
import fcntl
import json
import logging
import os

from common.errors import ConfigError
from common.storage_errors import describe
from training.run_directory.lock_holder import (
    LOCK_NAME,
    RunDirectoryInUse,
    RunLockLost,
    describe_holder,
    holder_record,
    in_use_error,
)

__all__ = ["LOCK_NAME", "LocalLock", "NoLock", "RunDirectoryInUse", "RunLockLost", "make_lock"]

log = logging.getLogger(__name__)


class LocalLock:
    """The flock-based lock of a local model_dir."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.path = os.path.join(model_dir, LOCK_NAME)
        self._fd = None
        self._created = []  # The folders acquire() made, deepest first: removed again if still empty at release.

    def acquire(self) -> None:
        self._created, folder = [], os.path.abspath(self.model_dir)
        while not os.path.exists(folder):
            self._created.append(folder)
            folder = os.path.dirname(folder)
        if not self._created and not os.path.isdir(self.model_dir):
            raise ConfigError(f"--model_dir={self.model_dir!r} is not a directory (a file is in the way). Nothing "
                              "was written: pass another --model_dir.")
        try:
            os.makedirs(self.model_dir, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"--model_dir={self.model_dir!r} cannot be created ({describe(error)}). Nothing was "
                              "written: pass a --model_dir in a folder you can write to.") from error
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise ConfigError(f"--model_dir={self.model_dir!r} is not writable ({describe(error)}). Nothing was "
                                  "written: pass a --model_dir you can write to.") from error
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                record = _read_record(fd)
                os.close(fd)
                raise in_use_error(self.model_dir, record, self.path) from None
            # The holder before us may have deleted the file between our open and flock: then retry on the new one.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = _read_record(fd)
        if previous.get("pid"):
            log.warning("Took over %s: its holder, %s, ended without releasing it.", self.path,
                        describe_holder(previous))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder_record()) + "\n").encode(), 0)
        self._fd = fd

    def check(self, *, confirm: bool = False) -> None:
        """The kernel holds a flock until the process ends: it cannot be lost."""

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # While still holding it: a waiting opener then retries on a fresh file.
        os.close(self._fd)
        self._fd = None
        for folder in self._created:  # A run stopped before writing anything leaves no empty folder behind.
            try:
                os.rmdir(folder)
            except OSError:  # Not empty: the run wrote there.
                break


def _read_record(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {"pid": "unknown (unreadable lock file)"}


class NoLock:
    """For a filesystem other than local and gs:// (e.g. s3://, via TensorFlow's plug-ins): not locked, said so."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir

    def acquire(self) -> None:
        log.warning("%s: no run lock on this filesystem (only local folders and gs://): make sure no other run "
                    "writes there.", self.model_dir)

    def check(self, *, confirm: bool = False) -> None:
        pass

    def release(self) -> None:
        pass


def make_lock(model_dir: str, *, storage_timeout_seconds: float = 120):
    """The lock for `model_dir`: gs:// objects (requests retried for `storage_timeout_seconds`), local (or
    mounted) folders, else NoLock."""
    if model_dir.startswith("gs://"):
        from common import extras

        return extras.load("gcs.run_lock").GcsLock(model_dir, storage_timeout_seconds=storage_timeout_seconds)
    return NoLock(model_dir) if "://" in model_dir else LocalLock(model_dir)
