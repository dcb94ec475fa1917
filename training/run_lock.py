"""One writer per model_dir: `model_dir/run.lock`, taken before anything is written and released at exit.

The lock records the holder's host, pid and start time. A second run on the same model_dir stops with exit 2
naming the holder. Multi-worker jobs: the chief holds it (the other workers write nothing there).
- Local (or NFS) folders: an exclusive `fcntl.flock` on the lock file. The kernel releases it when the holder dies,
  even by SIGKILL, so a lock left by a dead process is taken over at once (with a warning naming it).
- gs://: an object created with the precondition `if_generation_match=0` (only one creator wins), whose holder
  rewrites it every HEARTBEAT_SECONDS (generation-matched, so a taken-over lock is noticed). A lock whose heartbeat
  is older than STALE_AFTER_SECONDS, or whose holder was on this host and is gone, is taken over with a warning.
"""

import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
import threading
import time

from common.errors import ConfigError
from common.storage_errors import describe
from common.storage_wait import reporting

log = logging.getLogger(__name__)

LOCK_NAME = "run.lock"
HEARTBEAT_SECONDS = 30
STALE_AFTER_SECONDS = 300  # gs:// only: a heartbeat this old means the holder is gone (a preempted VM).


def _holder_record() -> dict:
    now = time.time()
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": _iso(now), "heartbeat": now}


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _describe_holder(record: dict) -> str:
    return f"pid {record.get('pid')} on host {record.get('host')} (started {record.get('started')})"


def _process_gone(record: dict) -> bool:
    """True when the holder ran on this host and its process no longer exists."""
    if record.get("host") != socket.gethostname() or not isinstance(record.get("pid"), int):
        return False
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class RunDirectoryInUse(ConfigError):
    """Another run holds the lock of this model_dir (exit 2)."""


def _in_use_error(model_dir: str, record: dict, lock_path: str, extra: str = "") -> ConfigError:
    return RunDirectoryInUse(f"{model_dir} is in use by another run: {_describe_holder(record)} holds "
                             f"{lock_path}.{extra} Wait for it to finish or stop it, or pass another --model_dir. If "
                             f"that process no longer exists, delete {lock_path}.")


class LocalLock:
    """The flock-based lock of a local model_dir."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.path = os.path.join(model_dir, LOCK_NAME)
        self._fd = None
        self._created = False

    def acquire(self) -> None:
        self._created = not os.path.exists(self.model_dir)
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
                raise _in_use_error(self.model_dir, record, self.path) from None
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
                        _describe_holder(previous))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_holder_record()) + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # While still holding it: a waiting opener then retries on a fresh file.
        os.close(self._fd)
        self._fd = None
        if self._created:  # A run stopped before writing anything leaves no empty folder behind.
            with contextlib.suppress(OSError):
                os.rmdir(self.model_dir)


def _read_record(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {"pid": "unknown (unreadable lock file)"}


class GcsLock:
    """The generation-precondition lock of a gs:// model_dir, with a heartbeat thread."""

    def __init__(self, model_dir: str, client=None):
        from common.gcs_checks import default_client, split_gs_path

        bucket_name, prefix = split_gs_path(model_dir)
        self.model_dir = model_dir
        self.path = f"{model_dir.rstrip('/')}/{LOCK_NAME}"
        self._blob = (client or default_client()).bucket(bucket_name).blob("/".join(filter(None, [prefix,
                                                                                                   LOCK_NAME])))
        self._generation = None
        self._record = None
        self._stop = threading.Event()
        self._thread = None

    def acquire(self) -> None:
        from google.api_core import exceptions

        record = _holder_record()
        try:
            with reporting(f"the run lock {self.path}"):
                self._blob.upload_from_string(json.dumps(record), if_generation_match=0, timeout=30)
        except exceptions.PreconditionFailed:
            self._take_over_if_stale(record)
        except exceptions.GoogleAPIError as error:
            raise ConfigError(f"--model_dir={self.model_dir!r}: creating the lock {self.path} failed "
                              f"({describe(error)}). Nothing was written.") from error
        self._generation, self._record = self._blob.generation, record
        self._thread = threading.Thread(target=self._heartbeat, name="run-lock-heartbeat", daemon=True)
        self._thread.start()

    def _take_over_if_stale(self, record: dict) -> None:
        from google.api_core import exceptions

        try:
            self._blob.reload(timeout=30)
            holder = json.loads(self._blob.download_as_bytes(if_generation_match=self._blob.generation, timeout=30))
        except exceptions.NotFound:  # Released in between: try once more from the start.
            holder = {"heartbeat": 0}
        except (exceptions.GoogleAPIError, ValueError):
            holder = {"pid": "unknown (unreadable lock object)", "heartbeat": time.time()}
        age = time.time() - float(holder.get("heartbeat") or 0)
        if age < STALE_AFTER_SECONDS and not _process_gone(holder):
            raise _in_use_error(self.model_dir, holder, self.path,
                                f" Its last heartbeat was {age:.0f} s ago (a lock is stale after "
                                f"{STALE_AFTER_SECONDS} s without one).")
        try:
            self._blob.upload_from_string(json.dumps(record), if_generation_match=self._blob.generation or 0,
                                          timeout=30)
        except exceptions.PreconditionFailed:  # Someone else took it over first.
            raise _in_use_error(self.model_dir, holder, self.path) from None
        if holder.get("pid"):
            log.warning("Took over the stale lock %s of %s (last heartbeat %.0f s ago).", self.path,
                        _describe_holder(holder), age)

    def _heartbeat(self) -> None:
        from google.api_core import exceptions

        while not self._stop.wait(HEARTBEAT_SECONDS):
            self._record["heartbeat"] = time.time()
            try:
                self._blob.upload_from_string(json.dumps(self._record), if_generation_match=self._generation,
                                              timeout=30)
                self._generation = self._blob.generation
            except exceptions.PreconditionFailed:
                log.error("The lock %s was taken over by another run: two runs may now write %s. Stop one.",
                          self.path, self.model_dir)
                return
            except exceptions.GoogleAPIError as error:
                log.warning("Lock heartbeat to %s failed (%s); retrying.", self.path, describe(error))

    def release(self) -> None:
        from google.api_core import exceptions

        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._generation is not None:
            with contextlib.suppress(exceptions.GoogleAPIError):
                self._blob.delete(if_generation_match=self._generation, timeout=30)
            self._generation = None


class NoLock:
    """For a filesystem other than local and gs:// (e.g. s3://, via TensorFlow's plug-ins): not locked, said so."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir

    def acquire(self) -> None:
        log.warning("%s: no run lock on this filesystem (only local folders and gs://): make sure no other run "
                    "writes there.", self.model_dir)

    def release(self) -> None:
        pass


def make_lock(model_dir: str):
    """The lock for `model_dir`: gs:// objects, local (or mounted) folders, else NoLock."""
    if model_dir.startswith("gs://"):
        return GcsLock(model_dir)
    return NoLock(model_dir) if "://" in model_dir else LocalLock(model_dir)
