"""A gs:// run frozen in the middle of a write, thawed after another run took its lock over: what it had started
must not land (the fence, gcs/generation_fence.py), and the run that took over trains to the end.

The frozen run is a process (SIGSTOP is the point), the run that takes over runs in the test's own process, both on
the loopback GCS server. The proxy holds the frozen run's request
(tests/gcs_server/request_rules.py), so the freeze falls in the middle of the write every time, not by luck.
"""

import json
import os
import signal
import time

import pytest

from gcs.run_lock import STOPPED_AFTER_HEARTBEATS
from helpers import Run, run_train_py
from training.run_directory.lock_holder import LOCK_NAME

DIGITS = "--gin_file=configs/experiments/digits_mlp.gin"
PERIODS = {"RUN_LOCK_HEARTBEAT_SECONDS": "1", "RUN_LOCK_STALE_AFTER_SECONDS": "10"}  # The default ratio, 30 : 300.
ARGS = [DIGITS, "--gin_param=experiment.lr_schedule='constant'", "--gin_param=TRAIN_STEPS=60",
        "--gin_param=STEPS_PER_LOOP=10", "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=0"]
# The frozen run's append of its record of step 20: the read of the file (its record of step 10 created it: nothing
# to read then), or the upload (the second one; TensorFlow's gs:// client, before the fence, also uploads it whole).
APPEND = {"read": (r"^GET /download/storage/v1/b/{bucket}/o/run/metrics\.jsonl\?.*ifGenerationMatch=[1-9]", 0),
          "write": (r"^POST /upload/storage/v1/b/{bucket}/o\?.* run/metrics\.jsonl$", 1)}


def _keys(text: str) -> list[tuple[str, int]]:
    return [(record["kind"], record["step"]) for record in map(json.loads, text.splitlines())]


def _take_over(gcs, bucket: str, monkeypatch, *args: str):
    """The second run: `train.py ARGS` in this process (its lock's periods are read when it starts, from PERIODS),
    to the end, while the first, a process of its own, stays frozen. It starts once the frozen run's heartbeat has
    stopped (STOPPED_AFTER_HEARTBEATS periods old), so it waits for the lock to go stale instead of refusing a live
    holder, as a rerun started by hand after a freeze would. Returns its CompletedProcess."""
    lock = gcs.client().bucket(bucket).blob(f"run/{LOCK_NAME}")
    stopped = STOPPED_AFTER_HEARTBEATS * float(PERIODS["RUN_LOCK_HEARTBEAT_SECONDS"]) + 0.5
    while time.time() - json.loads(lock.download_as_bytes())["heartbeat"] < stopped:
        time.sleep(0.1)
    for name, value in PERIODS.items():
        monkeypatch.setenv(name, value)
    second = run_train_py(*args)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "Took over the stale lock" in second.stdout
    return second


def _freeze_mid_request_then_take_over(gcs, bucket: str, request: tuple[str, int], monkeypatch):
    """Runs the first run until the proxy holds its `request` (a pattern, how many matches go through first),
    freezes it there (SIGSTOP), and runs the second to the end on the same model_dir. Returns (first, second, the
    held rule); the caller kills the first."""
    args = [*ARGS, f"--model_dir=gs://{bucket}/run"]
    held = gcs.hold(request[0].format(bucket=bucket), skip=request[1])
    first = Run(*args, env=PERIODS)
    try:
        assert gcs.wait_held(held, alive=lambda: first.process.poll() is None), first.stdout + first.stderr
        os.kill(first.process.pid, signal.SIGSTOP)
        return first, _take_over(gcs, bucket, monkeypatch, *args), held
    except BaseException:
        first.kill()
        raise


def _thaw(gcs, first: Run, held: str) -> tuple[int, int]:
    """Lets the frozen run's request through, then the run itself; returns (the request's status, its exit)."""
    status = gcs.release(held)
    os.kill(first.process.pid, signal.SIGCONT)
    return status, first.wait(timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("request_held", ["read", "write"])
def test_a_run_frozen_mid_append_lands_nothing_after_a_takeover(request_held, gcs, gcs_bucket, data_dir, monkeypatch):
    """Frozen while appending its record of step 20 to metrics.jsonl (in the read of the file, or in its upload);
    the second run resumes from ckpt-10 and trains to step 60. Thawed, the first run's request is refused (412): it
    exits 6 and metrics.jsonl is exactly what the second run left, one record per (kind, step)."""
    blob = gcs.client().bucket(gcs_bucket).blob("run/metrics.jsonl")
    first, second, held = _freeze_mid_request_then_take_over(gcs, gcs_bucket, APPEND[request_held], monkeypatch)
    try:
        assert "Resumed from" in second.stdout and "ckpt-10 at step 10" in second.stdout, second.stdout[-3000:]
        blob.reload()
        left, generation = blob.download_as_text(), blob.generation
        status, code = _thaw(gcs, first, held)
    finally:
        first.kill()
    assert status == 412, status  # The storage refused it ...
    assert code == 6, first.stdout[-3000:] + first.stderr[-3000:]  # ... and the run stopped on that.
    assert "error: This run no longer holds" in first.stderr and "Traceback" not in first.stderr, first.stderr
    blob.reload()
    assert (blob.download_as_text(), blob.generation) == (left, generation)  # Nothing of it landed.
    keys = _keys(left)
    assert sorted(keys) == sorted(set(keys)), keys  # One record per (kind, step) ...
    assert [step for kind, step in keys if kind == "train"] == [10, 20, 30, 40, 50, 60], keys  # ... none missing.


@pytest.mark.slow
def test_without_the_storage_enforcing_the_fence_the_frozen_append_lands_twice(gcs, gcs_bucket, data_dir, monkeypatch):
    """Negative control of the test above: the same freeze in the read of the append, thawed while the storage
    ignores generation preconditions on metrics.jsonl (not on the lock: as before the fence). The first run reads
    the second run's file and appends its record of step 20 again: the duplicate the issue saw (its exit is 6 all
    the same, at its next write)."""
    first, _, held = _freeze_mid_request_then_take_over(gcs, gcs_bucket, APPEND["read"], monkeypatch)
    try:
        with gcs.preconditions_ignored(r" run/metrics\.jsonl$"):
            status, code = _thaw(gcs, first, held)
    finally:
        first.kill()
    assert status == 200 and code == 6, (status, first.stderr[-3000:])
    keys = _keys(gcs.client().bucket(gcs_bucket).blob("run/metrics.jsonl").download_as_text())
    assert keys.count(("train", 20)) == 2, keys


@pytest.mark.slow
@pytest.mark.parametrize("rerun", ["the same settings", "another LEARNING_RATE"])
def test_a_checkpoint_save_under_way_when_frozen_completes_but_commits_nothing(rerun, gcs, gcs_bucket, data_dir,
                                                                             monkeypatch):
    """Frozen as its final save (ckpt-60) starts; the second run resumes from ckpt-50 and saves its own ckpt-60.
    Thawed, the first completes that one save (TensorFlow's gs:// client takes no preconditions: checkpoints are
    not fenced), then confirms its lock before naming the save in the `checkpoint` state file: it stops there with
    exit 6, and the state file and the other checkpoints are untouched. With the same settings its ckpt-60 is the
    second run's bit for bit (a resumed run continues exactly): the late write is harmless. With LEARNING_RATE
    changed on the rerun (allowed on resume) it is not: the old weights replace the new ones in ckpt-60 (the limit
    docs/gcs.md states; and the negative control: the comparison can fail)."""
    from helpers import checkpoint_values

    model_dir = f"gs://{gcs_bucket}/run"
    bucket = gcs.client().bucket(gcs_bucket)
    settings = [] if rerun == "the same settings" else ["--gin_param=LEARNING_RATE=0.2"]
    held = gcs.hold(rf"^POST /upload/storage/v1/b/{gcs_bucket}/o\?.*name=run/checkpoints/ckpt-60_temp")
    first = Run(*ARGS, f"--model_dir={model_dir}", env=PERIODS)
    try:
        assert gcs.wait_held(held, alive=lambda: first.process.poll() is None), first.stdout + first.stderr
        os.kill(first.process.pid, signal.SIGSTOP)
        second = _take_over(gcs, gcs_bucket, monkeypatch, *ARGS, *settings, f"--model_dir={model_dir}")
        assert "ckpt-50 at step 50" in second.stdout, second.stdout[-3000:]
        saved, state = checkpoint_values(model_dir), bucket.get_blob("run/checkpoints/checkpoint").generation
        names = {blob.name: blob.generation for blob in bucket.list_blobs(prefix="run/checkpoints/")}
        _, code = _thaw(gcs, first, held)
    finally:
        first.kill()
    assert code == 6 and "error: This run no longer holds" in first.stderr, first.stderr[-3000:]
    after = {blob.name: blob.generation for blob in bucket.list_blobs(prefix="run/checkpoints/")}
    assert after.keys() == names.keys(), (names, after)  # Nothing deleted, nothing left behind ...
    assert bucket.get_blob("run/checkpoints/checkpoint").generation == state  # ... the state file untouched ...
    assert after["run/checkpoints/ckpt-60.index"] != names["run/checkpoints/ckpt-60.index"]  # ... ckpt-60 rewritten.
    values = checkpoint_values(model_dir)
    same = all((values[key] == saved[key]).all() for key in saved)
    assert same == (rerun == "the same settings"), rerun
