"""The run lock of a gs:// model_dir (training/run_directory/lock.py says why there is one): an object created with the
precondition `if_generation_match=0` (only one creator wins), whose holder rewrites it every HEARTBEAT_SECONDS
(generation-matched, so a taken-over lock is noticed).

A lock whose heartbeat is older than STALE_AFTER_SECONDS, or whose holder was on this host and is gone, is taken
over with a warning; a lock whose heartbeat stopped less long ago (a holder that died on another host, or is cut
off from the bucket) is waited for, with a progress line, until it is stale or its heartbeat comes back. The
heartbeat a run counts from, and the one its record carries, is that of the write that took the lock (the create or
the takeover), never the time it started waiting: a wait longer than the fence would otherwise stop it at once.

Never two writers: the holder stops writing (`check` raises RunLockLost, a StorageError: exit 6) as soon as it
learns the lock was taken over, and also when its own last heartbeat that reached the bucket is FENCE_FRACTION of
the stale time old: it cannot know whether another run has taken over, so it stops well before anyone may. Every
write to model_dir asks `check` first (training/run_directory/storage_guard.py); checkpoint saves and exports also
read the lock back, before and again before they are committed. A process frozen (SIGSTOP, a paused VM) in the
middle of a write cannot land it once it has lost the lock: the record files (metrics.jsonl, metrics.json, ...) are
written through the lock's fence (gcs/generation_fence.py), whose generation preconditions the storage enforces,
and a run that takes the lock rewrites them first. What TensorFlow writes itself (checkpoint files, exports,
TensorBoard events) takes no preconditions: a save under way when the holder froze writes its ckpt-<step> files when
it thaws, then stops before naming them in the state file (docs/gcs.md says what that leaves). The hosts' clocks
must agree to well within the fence (Cloud VMs keep NTP time).
RUN_LOCK_HEARTBEAT_SECONDS and RUN_LOCK_STALE_AFTER_SECONDS in the environment override the two periods (the tests
shrink them); the holder records its own in the lock, and a run waiting on it uses the holder's.
"""

import contextlib
import json
import logging
import os
import threading
import time

from common.errors import ConfigError, StorageError
from common.storage_errors import describe, transient
from common.storage_wait import PROGRESS_SECONDS, reporting
from gcs.generation_fence import GenerationFence
from training.run_directory.lock_holder import (
    LOCK_NAME,
    RunLockLost,
    describe_holder,
    holder_record,
    in_use_error,
    process_gone,
)

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 30
STALE_AFTER_SECONDS = 300  # A heartbeat this old means the holder is gone (a preempted VM).
FENCE_FRACTION = 0.5  # The holder stops writing when its last heartbeat that got through is this much of stale old.
STOPPED_AFTER_HEARTBEATS = 2.5  # A heartbeat older than this many periods has stopped: waited for, not refused.


class GcsLock:
    """The generation-precondition lock of a gs:// model_dir, with a heartbeat thread."""

    def __init__(self, model_dir: str, client=None, *, heartbeat_seconds: float | None = None,
                 stale_after_seconds: float | None = None, storage_timeout_seconds: float = 120):
        from google.cloud.storage.retry import DEFAULT_RETRY

        from gcs.bucket_checks import default_client, split_gs_path

        bucket_name, prefix = split_gs_path(model_dir)
        self.model_dir = model_dir
        self.path = f"{model_dir.rstrip('/')}/{LOCK_NAME}"
        self._bucket = (client or default_client()).bucket(bucket_name)
        self._name = "/".join(filter(None, [prefix, LOCK_NAME]))
        self._blob = self._bucket.blob(self._name)
        self.heartbeat_seconds = heartbeat_seconds or _seconds_from_environment("RUN_LOCK_HEARTBEAT_SECONDS",
                                                                                 HEARTBEAT_SECONDS)
        self.stale_after_seconds = stale_after_seconds or _seconds_from_environment("RUN_LOCK_STALE_AFTER_SECONDS",
                                                                                     STALE_AFTER_SECONDS)
        self.fence_seconds = self.stale_after_seconds * FENCE_FRACTION
        # Requests retried for the run's storage timeout at start-up; a heartbeat for one period (the next one
        # follows); generation-matched, so a retry never overwrites someone else's lock.
        self._retry = DEFAULT_RETRY.with_timeout(storage_timeout_seconds)
        self._heartbeat_retry = DEFAULT_RETRY.with_timeout(self.heartbeat_seconds)
        self._generation = None
        self._record = None
        self._confirmed = None  # time.monotonic() of the newest heartbeat known to have reached the bucket.
        self._lost = None  # Why the lock is no longer this run's, once known.
        self._stop = threading.Event()
        self._thread = None
        # The run's record files are written through it (training/run_directory/layout.py, history.py).
        self.fence = GenerationFence(self._bucket, self._name, confirm_held=self._confirm_held,
                                     retry=DEFAULT_RETRY.with_timeout(30))

    def acquire(self) -> None:
        from google.api_core import exceptions

        record = {**holder_record(), "heartbeat_seconds": self.heartbeat_seconds,
                  "stale_after_seconds": self.stale_after_seconds}
        while True:
            beat = _stamp(record)
            try:
                with reporting(f"the run lock {self.path}"):
                    self._blob.upload_from_string(json.dumps(record), if_generation_match=0, timeout=30,
                                                  retry=self._retry)
                break
            except exceptions.PreconditionFailed:
                beat = self._take_over_or_wait(record, beat)
                if beat is not None:
                    break
            except Exception as error:  # noqa: BLE001 - google-cloud-storage and requests errors alike.
                if not isinstance(error, exceptions.GoogleAPIError) and not transient(error):
                    raise
                raise self._unusable(error, "creating the lock") from error
        self._generation, self._record, self._confirmed = self._blob.generation, record, beat
        self._thread = threading.Thread(target=self._heartbeat, name="run-lock-heartbeat", daemon=True)
        self._thread.start()
        try:  # Before anything is read: writes an earlier holder still has pending are refused from now on.
            with reporting(f"the record files of {self.model_dir} (rewritten by a run that takes the lock)"):
                rewritten = self.fence.establish(record["token"])
        except BaseException:
            self.release()
            raise
        log.debug("Holding %s; rewrote %d record file(s) of earlier holders, so that writes they started cannot "
                  "land.", self.path, rewritten)

    def _unusable(self, error: BaseException, doing: str) -> Exception:
        """A StorageError (exit 6: a rerun may succeed) when the bucket did not answer, else a ConfigError."""
        message = (f"--model_dir={self.model_dir!r}: {doing} {self.path} failed ({describe(error)}). Nothing was "
                   "written.")
        if transient(error):
            return StorageError(f"{message} Rerun the same command once the storage answers.")
        return ConfigError(message)

    def _take_over_or_wait(self, record: dict, created: float) -> float | None:
        """Takes over a stale lock; waits while its holder's heartbeat has stopped but is not yet stale. Returns the
        time.monotonic() of the write that got through (`created`: of this run's own create, whose answer was
        lost), or None when the lock vanished meanwhile (create it again); RunDirectoryInUse for a live holder.
        The heartbeat is stamped just before the takeover write, never before the wait: a wait longer than the
        fence would otherwise leave this run, right after the takeover, believing its heartbeat long stopped."""
        from google.api_core import exceptions

        reported = 0.0
        while True:
            blob = self._bucket.blob(self._name)
            try:
                blob.reload(timeout=30, retry=self._retry)
                holder = json.loads(blob.download_as_bytes(if_generation_match=blob.generation, timeout=30,
                                                           retry=self._retry))
            except exceptions.NotFound:  # Released in between: try once more from the start.
                return None
            except exceptions.PreconditionFailed:  # Rewritten between the two reads: read it again.
                continue
            except ValueError:
                holder = {"pid": "unknown (unreadable lock object)", "heartbeat": time.time()}
            except Exception as error:  # noqa: BLE001 - google-cloud-storage and requests errors alike.
                if not isinstance(error, exceptions.GoogleAPIError) and not transient(error):
                    raise
                raise self._unusable(error, "reading the lock") from error
            if holder.get("token") == record["token"]:  # Our own create: its answer was lost and it was retried.
                self._blob = blob
                return created
            age = time.time() - _number(holder.get("heartbeat"), 0.0)
            stale = _number(holder.get("stale_after_seconds"), STALE_AFTER_SECONDS)  # The holder's own periods.
            stopped = STOPPED_AFTER_HEARTBEATS * _number(holder.get("heartbeat_seconds"), HEARTBEAT_SECONDS)
            if age >= stale or process_gone(holder):
                break
            if age < stopped:
                raise in_use_error(self.model_dir, holder, self.path,
                                    f" Its last heartbeat was {age:.0f} s ago (a lock is stale after {stale:.0f} s "
                                    "without one).")
            if time.monotonic() - reported >= PROGRESS_SECONDS or not reported:
                reported = time.monotonic()
                log.warning("Waiting for %s: its holder, %s, sent no heartbeat for %.0f s (it died, or cannot reach "
                            "the bucket; then it stops writing by itself). It is taken over at %.0f s, unless its "
                            "heartbeat comes back.", self.path, describe_holder(holder), age, stale)
            time.sleep(max(0.05, min(stopped / STOPPED_AFTER_HEARTBEATS, stale - age)))
        beat = _stamp(record)
        try:
            self._blob.upload_from_string(json.dumps(record), if_generation_match=blob.generation, timeout=30,
                                          retry=self._retry)
        except exceptions.PreconditionFailed:  # Someone else took it over first.
            raise in_use_error(self.model_dir, holder, self.path) from None
        if holder.get("pid"):
            log.warning("Took over the stale lock %s of %s (last heartbeat %.0f s ago).", self.path,
                        describe_holder(holder), age)
        return beat

    def _heartbeat(self) -> None:
        from google.api_core import exceptions

        while not self._stop.wait(self.heartbeat_seconds):
            beat = _stamp(self._record)
            try:
                self._blob.upload_from_string(json.dumps(self._record), if_generation_match=self._generation,
                                              timeout=30, retry=self._heartbeat_retry)
                self._generation, self._confirmed = self._blob.generation, beat
            except (exceptions.PreconditionFailed, exceptions.NotFound):
                if self._own_write_got_through(beat):  # A retried upload whose first try had succeeded.
                    continue
                self._lost = "another run took it over (or it was deleted)"
                log.error("The lock %s was taken over by another run: this run writes nothing more to %s.",
                          self.path, self.model_dir)
                return
            except Exception as error:  # noqa: BLE001 - any failure: the fence (check) decides, not this thread.
                log.warning("Lock heartbeat to %s failed (%s); retrying. Without one for %.0f s this run stops "
                            "writing.", self.path, describe(error, 200), self.fence_seconds)

    def _own_write_got_through(self, beat: float) -> bool:
        """After a 412: whether the lock still holds this run's own record (then it continues from its
        generation)."""
        blob = self._bucket.blob(self._name)
        try:
            blob.reload(timeout=30)
            current = json.loads(blob.download_as_bytes(if_generation_match=blob.generation, timeout=30))
        except Exception:  # noqa: BLE001 - cannot tell: treated as taken over (stopping is the safe side).
            return False
        if current.get("token") != self._record["token"]:
            return False
        self._generation, self._confirmed = blob.generation, beat
        return True

    def _confirm_held(self, what: str) -> None:
        """After the storage refused a write of this run (gcs/generation_fence.py): RunLockLost unless the lock,
        read back now, is still this run's (unreadable counts as lost: stopping is the safe side)."""
        if self._lost is None:
            try:
                current = json.loads(self._bucket.blob(self._name).download_as_bytes(
                    timeout=10, retry=self._heartbeat_retry))
                if current.get("token") != self._record["token"]:
                    self._lost = f"{what}; the lock names {describe_holder(current)}"
            except Exception as error:  # noqa: BLE001 - deleted, unreadable: cannot tell, so lost.
                self._lost = f"{what}; the lock could not be read back ({describe(error, 200)})"
        self.check()

    def check(self, *, confirm: bool = False) -> None:
        """RunLockLost if this run may no longer write model_dir: the lock was taken over, or no heartbeat has
        reached the bucket for `fence_seconds` (half the stale time). `confirm` also reads the lock back (before a
        checkpoint save)."""
        from google.api_core import exceptions

        if self._lost is None and self._confirmed is not None:
            silent = time.monotonic() - self._confirmed
            if silent > self.fence_seconds:
                self._lost = (f"no heartbeat has reached it for {silent:.0f} s, and another run may take a lock over "
                              f"after {self.stale_after_seconds:.0f} s without one")
        if self._lost is None and confirm:
            try:
                current = json.loads(self._bucket.blob(self._name).download_as_bytes(
                    timeout=10, retry=self._heartbeat_retry))
                if current.get("token") != self._record["token"]:
                    self._lost = f"it now names {describe_holder(current)}"
            except exceptions.NotFound:
                self._lost = "it was deleted"
            except Exception:  # noqa: BLE001 - unreadable now: the heartbeat's fence decides.
                pass
        if self._lost is not None:
            raise RunLockLost(f"This run no longer holds {self.path}: {self._lost}. It stopped writing "
                              f"{self.model_dir} at once (nothing was written after it knew), so two runs never write "
                              "there together.")

    def release(self) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._generation is not None and self._lost is None:
            # A lock left behind is taken over by the next run (on this host at once, elsewhere once stale).
            with contextlib.suppress(Exception):
                self._blob.delete(if_generation_match=self._generation, timeout=10,
                                  retry=DEFAULT_RETRY.with_timeout(10))
        self._generation = None


def _stamp(record: dict) -> float:
    """Stamps `record` with the time of the write about to be sent; returns that time on the monotonic clock."""
    record["heartbeat"] = time.time()
    return time.monotonic()


def _number(value, default: float) -> float:
    """A positive number from a lock record, or `default` (older records lack the periods)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return number if number > 0 else default


def _seconds_from_environment(name: str, default: float) -> float:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ConfigError(f"{name}={value!r} must be a number of seconds > 0 (or unset: {default:g}).")
    return seconds
