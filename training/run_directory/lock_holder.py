"""Who holds a run lock (training/run_directory/lock.py): the holder's record, how it is named in messages, the errors.

A leaf module: the local and the gs:// lock both use it.
"""

import datetime
import os
import socket
import time
import uuid

from common.errors import ConfigError, StorageError

LOCK_NAME = "run.lock"


def holder_record() -> dict:
    """This process as a lock's holder; `token` tells two runs of one pid apart (a lock read back is this run's)."""
    now = time.time()
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": _iso(now), "heartbeat": now,
            "token": uuid.uuid4().hex}


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def describe_holder(record: dict) -> str:
    return f"pid {record.get('pid')} on host {record.get('host')} (started {record.get('started')})"


def process_gone(record: dict) -> bool:
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


class RunLockLost(StorageError):
    """This run no longer holds its gs:// lock (taken over, or its heartbeat cut off): it writes nothing more
    (exit 6)."""


def in_use_error(model_dir: str, record: dict, lock_path: str, extra: str = "") -> ConfigError:
    """Exit 2, naming the holder and what to do."""
    return RunDirectoryInUse(f"{model_dir} is in use by another run: {describe_holder(record)} holds "
                             f"{lock_path}.{extra} Wait for it to finish or stop it, or pass another --model_dir. If "
                             f"that process no longer exists, delete {lock_path}.")
