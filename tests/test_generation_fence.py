"""The fence of a gs:// run directory (gcs/generation_fence.py), in-process against the loopback GCS server: a run
that lost its lock cannot land a write it had started, the run that took it over writes on, and local folders are
as before. The frozen process is stood in for by a lock whose heartbeat thread is stopped (what SIGSTOP does to it);
tests/test_run_lock_fence.py freezes real training processes."""

import json
import time

import pytest

from gcs.run_lock import GcsLock
from training.run_directory.history import History
from training.run_directory.layout import RunDirectory
from training.run_directory.lock import LOCK_NAME, RunLockLost
from training.run_directory.storage_guard import StorageGuard


def _frozen_holder(model_dir: str) -> GcsLock:
    """A lock whose holder then stops (its heartbeat thread ends, as a frozen process's would), stale after 2 s."""
    lock = GcsLock(model_dir, heartbeat_seconds=0.2, stale_after_seconds=2)
    lock.acquire()
    lock._stop.set()
    lock._thread.join()
    return lock


def _run_directory(model_dir: str, lock) -> RunDirectory:
    guard = StorageGuard()
    guard.lock = lock
    return RunDirectory(model_dir, guard=guard)


def _text(gcs, bucket: str, name: str) -> str:
    return gcs.client().bucket(bucket).blob(name).download_as_text()


@pytest.mark.parametrize("enforced", [True, False])
def test_writes_a_holder_started_before_losing_its_lock_are_refused(enforced, gcs, gcs_bucket):
    model_dir = f"gs://{gcs_bucket}/run"
    old = _frozen_holder(model_dir)
    old_dir = _run_directory(model_dir, old)
    old_history = History(old_dir)
    old_history.resume(0)
    old_history.record("train", 10, {"loss": 1.0})
    old_dir.write_text("command.txt", "old\n")
    time.sleep(2.2)  # Stale: the next run takes it over.
    new = GcsLock(model_dir, heartbeat_seconds=0.2, stale_after_seconds=2)
    new.acquire()  # Rewrites the record files the old holder wrote: their generations change.
    try:
        new_dir = _run_directory(model_dir, new)
        new_history = History(new_dir)
        new_history.resume(0)  # Drops the old holder's record of step 10: it will be trained again.
        new_history.record("train", 10, {"loss": 0.5})
        old._confirmed = time.monotonic()  # Its own fence (half the stale time) would stop it before it writes:
        old._lost = None  # here it is the write already under way that the storage must refuse.
        if enforced:
            with pytest.raises(RunLockLost, match="its write of .*metrics.jsonl, started before it knew, was "
                                                  "refused by the storage"):
                old_history.record("train", 20, {"loss": 0.9})
            old._lost = None  # The fence itself, as write_text calls it (its guard now refuses any write).
            with pytest.raises(RunLockLost, match="command.txt, started before it knew"):
                old.fence.write(old_dir.path("command.txt"), "old again\n")
        else:  # Negative control: a storage that ignores the preconditions lets the old holder's write land.
            with gcs.preconditions_ignored():
                old_history.record("train", 20, {"loss": 0.9})
        new_history.record("train", 20, {"loss": 0.25})
        new_dir.write_text("command.txt", "new\n")
    finally:
        new.release()
    records = [json.loads(line) for line in _text(gcs, gcs_bucket, "run/metrics.jsonl").splitlines()]
    keys = [(record["kind"], record["step"], record["metrics"]["loss"]) for record in records]
    if enforced:
        assert keys == [("train", 10, 0.5), ("train", 20, 0.25)], keys
        assert _text(gcs, gcs_bucket, "run/command.txt") == "new\n"
    else:
        assert ("train", 20, 0.9) in keys, keys


def test_a_record_file_an_old_holder_created_after_the_takeover_is_replaced(gcs, gcs_bucket, caplog):
    """A creation where nothing was cannot be refused by a precondition: the holder's next write replaces it."""
    model_dir = f"gs://{gcs_bucket}/run"
    old = _frozen_holder(model_dir)
    time.sleep(2.2)
    new = GcsLock(model_dir, heartbeat_seconds=0.2, stale_after_seconds=2)
    new.acquire()
    try:
        old._confirmed, old._lost = time.monotonic(), None
        old_dir = _run_directory(model_dir, old)
        History(old_dir).record("train", 10, {"loss": 1.0})  # Lands: metrics.jsonl did not exist.
        old_dir.write_text("metrics.json", '{"step": 10}\n')
        new_dir = _run_directory(model_dir, new)
        history = History(new_dir)
        history.record("train", 5, {"loss": 0.5})
        new_dir.write_text("metrics.json", '{"step": 5}\n')
        history.record("train", 10, {"loss": 0.25})
    finally:
        new.release()
    keys = [(record["step"], record["metrics"]["loss"])
            for record in map(json.loads, _text(gcs, gcs_bucket, "run/metrics.jsonl").splitlines())]
    assert keys == [(5, 0.5), (10, 0.25)], keys  # The old holder's record of step 10 is gone.
    assert _text(gcs, gcs_bucket, "run/metrics.json") == '{"step": 5}\n'
    assert "by a run that no longer holds it" in caplog.text


def test_a_fenced_write_rides_out_a_busy_storage_and_a_local_folder_is_unchanged(gcs, gcs_bucket, tmp_path,
                                                                                  caplog):
    """A 503 is retried; a write whose answer was lost (done, then 503: the retry gets 412) is recognised as this
    run's own, not as another run's; local folders are written as before, without a fence."""
    model_dir = f"gs://{gcs_bucket}/run"
    lock = GcsLock(model_dir)
    lock.acquire()
    try:
        run_dir = _run_directory(model_dir, lock)
        rule = gcs.inject_failures(rf"^POST /upload/storage/v1/b/{gcs_bucket}/o\?.* run/command\.txt$", 503, 1)
        run_dir.write_text("command.txt", "python train.py\n")
        lost = gcs.inject_failures(rf"^POST /upload/storage/v1/b/{gcs_bucket}/o\?.* run/metrics\.jsonl$", 503, 1,
                                   forwarded=True)
        History(run_dir).record("train", 10, {"loss": 1.0})
        History(run_dir).record("train", 20, {"loss": 0.5})  # Over the generation the lost answer carried.
        assert gcs.failures_served(rule) and gcs.failures_served(lost), "no failure served: nothing was checked"
        assert "no longer holds" not in caplog.text, caplog.text  # Its own write, not a stale holder's ...
        assert "not written" not in caplog.text, caplog.text  # ... and known as done (not kept for a rewrite).
        assert [record["step"] for record in map(json.loads, _text(gcs, gcs_bucket, "run/metrics.jsonl").splitlines())
                ] == [10, 20]
        assert _text(gcs, gcs_bucket, "run/command.txt") == "python train.py\n"
        blob = gcs.client().bucket(gcs_bucket).get_blob("run/command.txt")
        assert blob.metadata["run-lock"] == f"run/{LOCK_NAME}"  # What the next holder rewrites on taking over.
    finally:
        lock.release()
    local = RunDirectory(str(tmp_path))
    assert local.guard.fenced(local.path("command.txt")) is None
    local.write_text("command.txt", "x\n")
    assert (tmp_path / "command.txt").read_text() == "x\n"


def test_an_export_under_way_when_the_lock_is_lost_replaces_nothing(gcs, gcs_bucket, small_config):
    """Exports are written by TensorFlow (no preconditions): a run that lost its lock while one was under way stops
    at its commit, before it removes or replaces the new holder's export of that step."""
    from tpu_utils.strategy import make_strategy
    from training.run_directory import export
    from training.trainer import Trainer

    trainer = Trainer(small_config(), make_strategy("default"))
    target = f"gs://{gcs_bucket}/run/export/40"
    bucket = gcs.client().bucket(gcs_bucket)
    export.export_saved_model(trainer.model, trainer.task, target)  # The new holder's.
    before = {blob.name: blob.generation for blob in bucket.list_blobs(prefix="run/export/")}

    def lost():
        raise RunLockLost("taken over")

    with pytest.raises(RunLockLost):
        export.export_saved_model(trainer.model, trainer.task, target, before_commit=lost)
    assert {blob.name: blob.generation for blob in bucket.list_blobs(prefix="run/export/")} == before
    export.export_saved_model(trainer.model, trainer.task, target, before_commit=lambda: None)  # Negative control:
    after = {blob.name: blob.generation for blob in bucket.list_blobs(prefix="run/export/")}  # the check can fail.
    assert after.keys() == before.keys() and after != before
