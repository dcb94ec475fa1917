"""The run lock of a gs:// model_dir (gcs/run_lock.py, an extra), on the loopback GCS server: a second run exits 2
within seconds naming the holder; a lock without a recent heartbeat is taken over with a warning; a rerun that waited
out a stopped holder keeps the lock; released at exit."""

import json
import os
import time

import pytest
from test_run_lock import second_run_is_refused

from gcs.run_lock import GcsLock
from training.run_directory.lock import LOCK_NAME, RunDirectoryInUse


def test_a_second_run_on_a_held_gcs_model_dir_exits_2_naming_the_holder(gcs, gcs_bucket, data_dir):
    model_dir = f"gs://{gcs_bucket}/run"
    second_run_is_refused(model_dir, GcsLock(model_dir),
                          lambda: [name.removeprefix("run/") for name in gcs.object_names(gcs_bucket)])


def test_gcs_lock_excludes_takes_over_a_stale_lock_and_releases(gcs, gcs_bucket, caplog):
    model_dir = f"gs://{gcs_bucket}/run"
    first = GcsLock(model_dir)
    first.acquire()
    with pytest.raises(RunDirectoryInUse, match=r"Its last heartbeat was \d+ s ago"):
        GcsLock(model_dir).acquire()
    first.release()
    assert gcs.object_names(gcs_bucket) == []

    blob = gcs.client().bucket(gcs_bucket).blob(f"run/{LOCK_NAME}")
    stale = {"host": "preempted-vm", "pid": 4711, "started": "2026-01-01 00:00:00 UTC", "heartbeat": time.time() - 301}
    blob.upload_from_string(json.dumps(stale))
    second = GcsLock(model_dir)
    second.acquire()
    assert "Took over the stale lock" in caplog.text and "pid 4711 on host preempted-vm" in caplog.text
    assert json.loads(blob.download_as_bytes())["pid"] == os.getpid()
    second.release()

    fresh = {**stale, "heartbeat": time.time()}  # Negative control: a live holder on another host keeps it.
    blob.upload_from_string(json.dumps(fresh))
    with pytest.raises(RunDirectoryInUse, match="pid 4711 on host preempted-vm"):
        GcsLock(model_dir).acquire()



def test_a_gcs_lock_taken_over_after_a_long_wait_counts_its_heartbeat_from_the_takeover(gcs, gcs_bucket):
    """At the default ratio (heartbeat : stale = 1 : 10, here 1 s : 10 s) a rerun that waits out a stopped holder for
    longer than the fence (half the stale time) holds the lock at once: its last confirmed heartbeat, and the
    heartbeat in the record it wrote, are those of the takeover write, not of when it started waiting (it used to
    stop itself, exit 6, at its first write before its first heartbeat)."""
    model_dir = f"gs://{gcs_bucket}/run"
    blob = gcs.client().bucket(gcs_bucket).blob(f"run/{LOCK_NAME}")
    stopped = {"host": "preempted-vm", "pid": 4711, "started": "2026-01-01 00:00:00 UTC",
               "heartbeat": time.time() - 3, "heartbeat_seconds": 1, "stale_after_seconds": 10}
    blob.upload_from_string(json.dumps(stopped))
    lock = GcsLock(model_dir, heartbeat_seconds=600, stale_after_seconds=10)  # No heartbeat during this test.
    started = time.monotonic()
    lock.acquire()
    try:
        waited, took_over = time.monotonic() - started, time.time()
        assert waited > lock.fence_seconds, waited  # Negative control: the wait alone outlasted the fence ...
        lock.check()  # ... yet the lock is held: the takeover write is the last confirmed heartbeat.
        record = json.loads(blob.download_as_bytes())
        assert record["pid"] == os.getpid() and took_over - record["heartbeat"] < 2, (took_over, record)
    finally:
        lock.release()
