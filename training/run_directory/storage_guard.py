"""What every write to model_dir asks first: does this run still hold its lock, and has the storage been failing
for longer than `experiment.storage_timeout_seconds`?

Why: a run that lost its gs:// lock (taken over after its heartbeat went stale) must stop writing at once, or two
runs write one model_dir; and a run whose storage is gone must stop in bounded time, not train on for most of an
hour while every write fails. The outage clock starts at the first failed write and any write that succeeds resets
it. Checkpoint saves, metrics.json and exports are retried in place (training waits, with a line at each retry
saying what for); metrics.jsonl and TensorBoard keep what failed and write it with the next record (training goes
on). Once the storage has failed for the timeout, or the lock is lost, the run stops with a StorageError (exit 6)
and writes nothing more; the checkpoints saved before are intact.
"""

import logging
import time

from common.errors import StorageError
from common.settings import require_int
from common.storage_errors import describe, transient
from common.storage_wait import PROGRESS_SECONDS

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 120  # Below the gs:// lock's fence (run_lock.py): an outage ends as an outage.


class StorageGuard:
    """The write permission and the outage clock of one run directory.

    `lock`: the held run lock (an object with `check(confirm=...)` raising a StorageError once it is lost), set by
    training/experiment.py once it holds it. `recovery`: a callable naming what is intact (the controller sets it).
    `retries=False` raises every failure at once: on a multi-worker job a checkpoint save is collective, and one
    worker cannot redo it alone.
    """

    def __init__(self, *, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS, retries: bool = True,
                 clock=time.monotonic, sleep=time.sleep):
        self.timeout_seconds = timeout_seconds
        self.retries = retries
        self.lock = None
        self.recovery = None
        self._clock, self._sleep = clock, sleep
        self._failing_since = None
        self._first_failure = None
        self.stopped: StorageError | None = None  # Why this run writes nothing more, once it knows.

    @property
    def writable(self) -> bool:
        return self.stopped is None

    def fenced(self, path: str):
        """The held lock's fence when `path` is on gs:// (gcs/generation_fence.py: writes with generation
        preconditions, so that a write this run started before losing its lock cannot land), else None: local
        folders need none (an flock cannot be lost)."""
        fence = getattr(self.lock, "fence", None)
        return fence if fence is not None and fence.covers(path) else None

    def check(self, *, confirm: bool = False) -> None:
        """A StorageError if this run may no longer write: its lock is lost (`confirm`: ask the storage, not only
        the heartbeat's record), or the storage has failed for longer than the timeout."""
        if self.stopped is not None:
            raise self.stopped
        if self.lock is not None:
            try:
                self.lock.check(confirm=confirm)
            except StorageError as error:
                self.stopped = error
                raise
        if self._failing_since is not None and self._clock() - self._failing_since >= self.timeout_seconds:
            self._stop(None)

    def succeeded(self) -> None:
        self._failing_since = self._first_failure = None

    def failed(self, what: str, error: BaseException) -> None:
        """Records a failed write of `what`; a StorageError once the storage has failed for the timeout."""
        detail = f"{what} ({_cause(error)})"
        if self._failing_since is None:
            self._failing_since, self._first_failure = self._clock(), detail
        if self._clock() - self._failing_since >= self.timeout_seconds:
            self._stop(detail)

    def failing_seconds(self) -> float:
        return 0.0 if self._failing_since is None else self._clock() - self._failing_since

    def retry(self, what: str, attempt):
        """attempt() until it succeeds. A transient storage failure is retried, with a line before each retry, until
        the storage has failed for the timeout; any other failure is raised at once."""
        delay = 1.0
        while True:
            self.check()
            try:
                result = attempt()
            except Exception as error:  # noqa: BLE001 - sorted just below: only storage outages are retried.
                if not (self.retries and transient(error)):
                    raise
                self.failed(what, error)
                wait = min(delay, max(0.0, self.timeout_seconds - self.failing_seconds()))
                log.warning("Waiting for the storage: %s failed (%s); retrying in %.0f s (failing for %.0f s; the "
                            "run stops after %d s: experiment.storage_timeout_seconds).", what, _cause(error), wait,
                            self.failing_seconds(), self.timeout_seconds)
                self._sleep(wait)
                delay = min(delay * 2, PROGRESS_SECONDS)
                continue
            self.succeeded()
            return result

    def _stop(self, last: str | None) -> None:
        seconds = self.failing_seconds()
        latest = f"; the last: {last}" if last is not None and last != self._first_failure else ""
        recovery = self.recovery() if self.recovery else "The checkpoints saved before are intact."
        if "rerun" not in recovery.lower():
            recovery += " Rerun the same command once the storage is back."
        self.stopped = StorageError(
            f"The storage has failed for {seconds:.0f} s (experiment.storage_timeout_seconds={self.timeout_seconds}); "
            f"the run stopped and writes nothing more. The first failure: {self._first_failure}{latest}. {recovery}")
        raise self.stopped


def _cause(error: BaseException) -> str:
    """The storage's own words for a failure: those of the error a StorageError wraps, else the error's."""
    cause = error.__cause__ if isinstance(error, StorageError) and error.__cause__ is not None else error
    return describe(cause, 200)


def check_settings(config) -> None:
    require_int("storage_timeout_seconds", config.storage_timeout_seconds, minimum=1, example=DEFAULT_TIMEOUT_SECONDS)
