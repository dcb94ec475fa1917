"""One writer per model_dir: a second run exits 2 within seconds naming the holder (local and gs://); a lock left by
a dead process, or a gs:// lock without a recent heartbeat, is taken over with a warning; released at exit."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from common.errors import ConfigError
from gcs.run_lock import GcsLock
from helpers import run_train_py
from training.run_directory.lock import LOCK_NAME, LocalLock, RunDirectoryInUse

TINY = ["--gin_file=configs/experiments/digits_mlp.gin", "--gin_param=TRAIN_STEPS=10", "--gin_param=STEPS_PER_LOOP=5",
        "--gin_param=EVAL_EVERY=0", "--gin_param=experiment.lr_schedule='constant'"]
SECONDS = 40  # A refused run: Python + TensorFlow start-up (~5 s; more on a busy 2-core machine), nothing else.


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize("storage", ["local", "gs"])
def test_a_second_run_on_a_held_model_dir_exits_2_naming_the_holder(storage, tmp_path, data_dir, request):
    if storage == "gs":
        gcs, bucket = request.getfixturevalue("gcs"), request.getfixturevalue("gcs_bucket")
        model_dir = f"gs://{bucket}/run"
        lock = GcsLock(model_dir)
    else:
        model_dir = str(tmp_path / "run")
        lock = LocalLock(model_dir)
    lock.acquire()  # This test process is the first run.
    try:
        started = time.monotonic()
        second = run_train_py(*TINY, f"--model_dir={model_dir}", timeout=120)
        elapsed = time.monotonic() - started
        # The second run wrote nothing: only the holder's lock is there.
        names = gcs.object_names(bucket) if storage == "gs" else os.listdir(model_dir)
        assert names == (["run/run.lock"] if storage == "gs" else ["run.lock"])
    finally:
        lock.release()
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"is in use by another run: pid {os.getpid()} on host {socket.gethostname()}" in second.stderr
    assert "Traceback" not in second.stderr and "step " not in second.stdout
    assert elapsed < SECONDS, elapsed

    # Negative control: released, the same command runs.
    third = run_train_py(*TINY, f"--model_dir={model_dir}", timeout=300)
    assert third.returncode == 0, third.stderr[-2000:]
    if storage == "local":  # --mode=eval beside a training run: evaluates and prints, records nothing.
        metrics = open(os.path.join(model_dir, "metrics.json")).read()
        lock = LocalLock(model_dir)
        lock.acquire()
        try:
            evaluated = run_train_py(*TINY, f"--model_dir={model_dir}", "--mode=eval", timeout=300)
        finally:
            lock.release()
        assert evaluated.returncode == 0, evaluated.stderr[-2000:]
        assert "is in use by another run" in evaluated.stdout and "final: {'step': 10" in evaluated.stdout
        assert open(os.path.join(model_dir, "metrics.json")).read() == metrics


def test_two_local_locks_exclude_each_other_and_release_cleans_up(tmp_path):
    model_dir = str(tmp_path / "run")
    first = LocalLock(model_dir)
    first.acquire()
    record = json.load(open(os.path.join(model_dir, LOCK_NAME)))
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname() and record["started"]
    with pytest.raises(RunDirectoryInUse, match=f"pid {os.getpid()}"):
        LocalLock(model_dir).acquire()
    first.release()
    assert not os.path.exists(model_dir)  # Created by the lock, left empty: removed.
    second = LocalLock(model_dir)
    second.acquire()
    second.release()


def test_a_local_lock_left_by_a_dead_process_is_taken_over_with_a_warning(tmp_path, caplog):
    model_dir = str(tmp_path)
    pid = _dead_pid()
    with open(os.path.join(model_dir, LOCK_NAME), "w") as handle:
        json.dump({"host": socket.gethostname(), "pid": pid, "started": "2026-01-01 00:00:00 UTC"}, handle)
    lock = LocalLock(model_dir)
    lock.acquire()
    assert "ended without releasing it" in caplog.text and f"pid {pid}" in caplog.text
    assert json.load(open(os.path.join(model_dir, LOCK_NAME)))["pid"] == os.getpid()
    lock.release()


@pytest.mark.parametrize("model_dir, cause", [("{tmp}/a_file/run", "not a directory"),
                                              ("/sys/kernel/template-run", "permission denied")])
def test_an_unusable_model_dir_is_a_config_error_saying_why(model_dir, cause, tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError, match=f"cannot be created \\({cause}") as raised:
        LocalLock(model_dir.format(tmp=tmp_path)).acquire()
    assert "intact" not in str(raised.value)  # No claim about earlier checkpoints.


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
