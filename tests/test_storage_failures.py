"""Storage that fails: one writer for sure after a gs:// lock takeover, no silent gaps after a full disk, bounded
waits when the storage is gone, and exit 6 (not 2, not a traceback) for a storage failure wherever it happens.

Real storage only: the loopback GCS server (tests/gcs_server/) with its server stopped or its bucket denied, a real full
filesystem (a small tmpfs, which needs root: skipped otherwise) and a real per-file size limit (RLIMIT_FSIZE, which
makes the kernel cut a write short exactly as a full disk does).
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gcs.run_lock import GcsLock
from helpers import REPO_ROOT, Run, run_train_py
from training.run_directory.lock import LOCK_NAME, RunLockLost

DIGITS = "--gin_file=configs/experiments/digits_mlp.gin"
CONSTANT = "--gin_param=experiment.lr_schedule='constant'"


def _generations(gcs, bucket: str) -> dict:
    return {blob.name: blob.generation for blob in gcs.client().list_blobs(bucket)}


def _keys(text: str) -> list[tuple[str, int]]:
    """(kind, step) of every line of a metrics.jsonl; each line must be a whole record."""
    return [(record["kind"], record["step"]) for record in map(json.loads, text.splitlines())]


@pytest.mark.slow
# About 60 s: two training processes (one frozen: SIGSTOP needs a process) and the wait for the lock to go stale at
# the default ratio of heartbeat to stale time (30 s here), which is the condition of the bug it guards.
def test_a_run_whose_gcs_lock_is_taken_over_stops_with_exit_6_and_writes_nothing_after(gcs, gcs_bucket, data_dir):
    """At the default timing ratio (heartbeat : stale = 30 s : 300 s, here 3 s : 30 s) the first run is frozen
    (SIGSTOP: a stalled process, a preempted VM) before its first loop; the second reaches the lock as soon as it
    may wait for it (2.5 heartbeats after the last one), waits until it is stale, takes it over and trains to the
    end (it used to stop itself with exit 6 at its first write when it had waited longer than the fence, half the
    stale time, and that write came before its first heartbeat). Thawed, the first must notice before its next
    write, write nothing at all, and exit 6."""
    model_dir = f"gs://{gcs_bucket}/run"
    heartbeat, stale = 3, 30
    periods = {"RUN_LOCK_HEARTBEAT_SECONDS": str(heartbeat), "RUN_LOCK_STALE_AFTER_SECONDS": str(stale)}
    args = [DIGITS, CONSTANT, "--gin_param=TRAIN_STEPS=40", "--gin_param=STEPS_PER_LOOP=10",
            "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=20", f"--model_dir={model_dir}"]
    first = Run(*args, env=periods)
    # Started warm: its command must reach the lock within 2.5 heartbeats of the freeze, which a process start-up
    # beside other tests does not (it then found the heartbeat 20 s old, past the fence, and this test failed).
    second = Run(*args, env=periods, warm=True)
    try:
        first.wait_for("tracing and compiling the training loop")  # Nothing is being written now.
        os.kill(first.process.pid, signal.SIGSTOP)
        create = gcs.hold(rf"^POST /upload/storage/v1/b/{gcs_bucket}/o\?.*ifGenerationMatch=0\b.* run/{LOCK_NAME}$")
        second.go()
        gcs.wait_held(create, alive=lambda: second.process.poll() is None)  # The second run reached the lock.
        lock = gcs.client().bucket(gcs_bucket).blob(f"run/{LOCK_NAME}")
        while time.time() - json.loads(lock.download_as_bytes())["heartbeat"] < 2.5 * heartbeat + 0.5:
            time.sleep(0.1)
        gcs.release(create)
        # Its first writes come before its first heartbeat, as with the default periods (a 30 s heartbeat): the
        # proxy holds that heartbeat until the first loop is done, or 10 s at most (within the fence, 15 s).
        second.wait_for("Took over the stale lock", timeout=120)
        beat = gcs.hold(rf"^POST /upload/storage/v1/b/{gcs_bucket}/o\?.*ifGenerationMatch=[1-9].* run/{LOCK_NAME}$")
        gcs.wait_held(beat, alive=lambda: second.process.poll() is None)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and second.process.poll() is None and " 10/40 " not in second.stdout:
            time.sleep(0.1)
        gcs.release(beat)
        assert second.wait(timeout=300) == 0, second.stdout[-3000:] + second.stderr[-3000:]
        waiting = re.search(rf"Waiting for {model_dir}/{LOCK_NAME}: its holder, pid {first.process.pid} .* sent no "
                            r"heartbeat for (\d+) s", second.stdout)
        took_over = re.search(r"Took over the stale lock .* \(last heartbeat (\d+) s ago\)", second.stdout)
        assert waiting and took_over, second.stdout[-3000:]
        # The condition of the old failure: it waited longer than the fence before its first write.
        assert int(took_over[1]) - int(waiting[1]) > stale / 2, (waiting[0], took_over[0])
        before = _generations(gcs, gcs_bucket)
        history = gcs.client().bucket(gcs_bucket).blob("run/metrics.jsonl").download_as_text()
        os.kill(first.process.pid, signal.SIGCONT)
        code = first.wait(timeout=120)
    finally:
        first.kill()
        second.kill()
    assert code == 6, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"error: This run no longer holds {model_dir}/{LOCK_NAME}" in first.stderr, first.stderr[-3000:]
    assert "Traceback" not in first.stderr
    assert _generations(gcs, gcs_bucket) == before  # Not one object written, replaced or deleted after the thaw.
    keys = _keys(history)
    assert len(keys) == len(set(keys)), keys  # One writer: no (kind, step) twice ...
    assert [step for kind, step in keys if kind == "train"] == [10, 20, 30, 40]  # ... and the steps in order.


def test_a_gcs_lock_cut_off_from_its_bucket_stops_writing_before_anyone_may_take_it_over(gcs, gcs_bucket):
    model_dir = f"gs://{gcs_bucket}/run"
    lock = GcsLock(model_dir, heartbeat_seconds=0.2, stale_after_seconds=4)
    lock.acquire()
    try:
        time.sleep(0.8)
        lock.check()  # Negative control: heartbeats get through, the lock is held.
        gcs.deny_writes(gcs_bucket)  # From now on no heartbeat reaches the bucket (403).
        deadline = time.monotonic() + 20
        while True:
            try:
                lock.check()
            except RunLockLost as error:
                stopped, message = time.time(), str(error)
                break
            assert time.monotonic() < deadline, "the holder never stopped"
            time.sleep(0.05)
    finally:
        lock.release()
    assert "no heartbeat has reached it for" in message and "It stopped writing" in message
    last = json.loads(gcs.client().bucket(gcs_bucket).blob(f"run/{LOCK_NAME}").download_as_bytes())["heartbeat"]
    assert stopped - last < 4  # Stopped before the lock was stale: no other run could have taken it yet.


def test_a_gcs_lock_taken_over_is_noticed_by_the_heartbeat_and_by_a_read_back(gcs, gcs_bucket):
    model_dir = f"gs://{gcs_bucket}/run"
    blob = gcs.client().bucket(gcs_bucket).blob(f"run/{LOCK_NAME}")
    other = {"host": "other-vm", "pid": 4711, "started": "2026-01-01 00:00:00 UTC", "heartbeat": time.time()}
    slow = GcsLock(model_dir, heartbeat_seconds=600, stale_after_seconds=1200)
    slow.acquire()
    slow.check(confirm=True)  # Negative control: held, and the read-back agrees.
    blob.upload_from_string(json.dumps(other))  # Another run writes its own record over it.
    slow.check()  # Its last heartbeat is recent: only reading the lock back can tell ...
    with pytest.raises(RunLockLost, match="now names pid 4711 on host other-vm"):
        slow.check(confirm=True)  # ... as every checkpoint save does.
    slow.release()
    assert json.loads(blob.download_as_bytes())["pid"] == 4711  # Someone else's lock is never deleted.
    blob.delete()

    beating = GcsLock(model_dir, heartbeat_seconds=0.2, stale_after_seconds=60)
    beating.acquire()
    blob.upload_from_string(json.dumps(other))
    deadline = time.monotonic() + 20
    with pytest.raises(RunLockLost, match="another run took it over"):
        while time.monotonic() < deadline:
            beating.check()
            time.sleep(0.05)
    beating.release()


def test_a_gcs_lock_whose_heartbeat_stopped_is_waited_for_then_taken_over(gcs, gcs_bucket, caplog):
    """A holder that died on another host (no pid to look up): the rerun waits until the lock is stale, with a line
    saying so, instead of exit 2 (it used to be refused until 300 s after the holder's death)."""
    model_dir = f"gs://{gcs_bucket}/run"
    blob = gcs.client().bucket(gcs_bucket).blob(f"run/{LOCK_NAME}")
    dead = {"host": "preempted-vm", "pid": 4711, "started": "2026-01-01 00:00:00 UTC", "heartbeat": time.time() - 1,
            "heartbeat_seconds": 0.2, "stale_after_seconds": 3}
    blob.upload_from_string(json.dumps(dead))
    started = time.monotonic()
    lock = GcsLock(model_dir)
    lock.acquire()
    waited = time.monotonic() - started
    lock.release()
    assert f"Waiting for {model_dir}/{LOCK_NAME}: its holder, pid 4711 on host preempted-vm" in caplog.text
    assert "It is taken over at 3 s" in caplog.text and "Took over the stale lock" in caplog.text
    assert waited > 1.0, waited  # It waited for the holder's stale time; it did not take over at once.


HISTORY_UNDER_A_SIZE_LIMIT = textwrap.dedent("""
    import os, resource, signal, sys
    from training.run_directory.history import History
    from training.run_directory.layout import RunDirectory
    from training.observers.summaries import Summaries

    run_dir = RunDirectory(sys.argv[1])
    history, summaries = History(run_dir), Summaries(run_dir)
    path = run_dir.path("metrics.jsonl")

    def loop(step):
        summaries.scalars("train", step, {"loss": 1.0 / step})
        history.record("train", step, {"loss": 1.0 / step})

    def filled_up(path):  # Each file may grow 30 bytes more, then EFBIG: what a disk that fills up does.
        resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 30, resource.RLIM_INFINITY))

    def freed():
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    for step in range(1, 11):
        loop(step)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # Else the kernel kills the process instead of failing the write.
    filled_up(path)
    for step in range(11, 14):
        history.record("train", step, {"loss": 1.0 / step})
    print("half line:", not open(path).read().endswith("\\n"), flush=True)
    freed()
    events = os.path.join(run_dir.path("train"), os.listdir(run_dir.path("train"))[0])
    filled_up(events)
    for step in range(11, 14):
        summaries.scalars("train", step, {"loss": 1.0 / step})
    freed()
    for step in range(14, 16):
        loop(step)
    summaries.flush()
    history.flush()
""")


def test_a_write_cut_short_by_a_full_disk_is_repaired_not_merged_into_the_next(tmp_path):
    """metrics.jsonl: the append cut short left half a line; the old code appended the next record after it (the
    two merged into one unreadable line, the resume dropped it). TensorBoard: the events file with a cut record is
    unreadable past it; the events are written again into a new file."""
    result = subprocess.run([sys.executable, "-c", HISTORY_UNDER_A_SIZE_LIMIT, str(tmp_path)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "half line: True" in result.stdout  # The failure this test is about did happen ...
    assert "kept, and written with the next one" in result.stdout + result.stderr
    text = open(tmp_path / "metrics.jsonl").read()
    assert _keys(text) == [("train", step) for step in range(1, 16)]  # ... and nothing was lost or merged.

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "train"), size_guidance={"tensors": 0})
    events.Reload()
    assert sorted({event.step for event in events.Tensors("loss")}) == list(range(1, 16))
    assert len(os.listdir(tmp_path / "train")) >= 2  # The damaged file was given up for a new one.


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MB tmpfs: a filesystem that really fills up. Mounting it needs root; without, the test fails (never
    skips: a skipped test proves nothing) and says how to run it or leave it out."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): this test needs root, as CI runs it; "
                    "without root, leave it out with -k 'not disk_that_fills_up'")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(path) -> object:
    """Writes `path` until the filesystem is full; returns the open file (closing and deleting it frees the space)."""
    filler = open(path, "wb", buffering=0)
    for size in (1 << 20, 4096, 512, 1):
        try:
            while True:
                filler.write(b"\0" * size)
        except OSError:
            pass
    return filler


@pytest.mark.slow
def test_a_disk_that_fills_up_mid_run_and_is_freed_loses_nothing(small_disk, data_dir):
    """Training waits at the checkpoint save while the disk is full (saying so), then goes on: exit 0, every record
    in metrics.jsonl once, every loop in TensorBoard. The old code exited 1 at the failed save, after
    warnings."""
    model_dir = small_disk / "run"
    run = Run(DIGITS, CONSTANT, "--gin_param=TRAIN_STEPS=120", "--gin_param=STEPS_PER_LOOP=5",
              "--gin_param=CHECKPOINT_EVERY=5", "--gin_param=EVAL_EVERY=60",
              "--gin_param=experiment.storage_timeout_seconds=300", f"--model_dir={model_dir}")
    try:
        run.wait_for("step  30/120")
        filler = _fill(small_disk / "filler")
        run.wait_for("Waiting for the storage: the checkpoint save of step")
        time.sleep(2)  # A few more retries against the full disk.
        filler.close()
        os.remove(small_disk / "filler")
        code = run.wait(timeout=300)
    finally:
        run.kill()
    assert code == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "disk full" in run.stdout
    keys = _keys(open(model_dir / "metrics.jsonl").read())
    assert [step for kind, step in keys if kind == "train"] == list(range(5, 121, 5)), keys
    assert [step for kind, step in keys if kind == "eval"] == [60, 120]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(model_dir / "train"), size_guidance={"tensors": 0})
    events.Reload()
    assert sorted({event.step for event in events.Tensors("loss")}) == list(range(5, 121, 5))


def _without_test_retries() -> dict:
    """The environment without the tests' own fast GCS retry settings: train.py's defaults apply."""
    return {key: value for key, value in os.environ.items() if not key.startswith("GCS_")}


@pytest.mark.slow
# About 60 s: a training process, then the wait for its storage timeout (15 s) with TensorFlow's own GCS retries,
# which are the point (the run's exit must not depend on the suite's shorter ones).
def test_storage_gone_for_good_ends_the_run_in_bounded_time_with_exit_6(gcs, gcs_bucket, data_dir):
    """With TensorFlow's own retries each failing gs:// operation took ~200 s and the run 44 minutes to exit 1.
    Here: train.py's shorter GCS retries, the run's storage timeout (15 s), a line saying what it waits for."""
    model_dir = f"gs://{gcs_bucket}/run"
    run = Run(DIGITS, CONSTANT, "--gin_param=TRAIN_STEPS=100000", "--gin_param=STEPS_PER_LOOP=10",
              "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=0",
              "--gin_param=experiment.storage_timeout_seconds=15", f"--model_dir={model_dir}",
              environment=_without_test_retries())
    try:
        run.wait_for(" 20/100000 ")
        gcs.stop_server()
        stopped = time.monotonic()
        code = run.wait(timeout=400)
        seconds = time.monotonic() - stopped
    finally:
        run.kill()
        gcs.restart_server()
    assert code == 6, run.stdout[-3000:] + run.stderr[-3000:]
    assert seconds < 150, seconds  # Generous: about 30-60 s here; over 200 s per failing operation before.
    # Whichever write meets the outage first says what it waits for: a save, the record, the TensorBoard events or
    # the lock's heartbeat (which one depends on where in the loop the outage falls).
    assert any(line in run.stdout for line in ("Waiting for the storage:", "kept, and written with the next one",
                                               "kept, and written into a new events file",
                                               "retrying. Without one for")), run.stdout[-3000:]
    assert "error: The storage has failed for" in run.stderr and "storage_timeout_seconds=15" in run.stderr
    assert "Traceback" not in run.stderr


def test_an_outage_at_start_up_is_a_storage_error_wherever_it_happens(gcs, gcs_bucket, data_dir, tmp_path):
    """Exit 6 and one `error:` line, never exit 2 ("cannot be read") nor a raw AbortedError traceback: the
    launcher reruns exit 6 and not exit 2."""
    import tensorflow as tf

    from common.errors import StorageError
    from common.storage_errors import outage_message
    from data import builders
    from data.registry import get_dataset_spec
    from training.run_directory.checkpoints import checkpoint_steps
    from training.run_directory.layout import RunDirectory

    model_dir = f"gs://{gcs_bucket}/run"
    tf.io.gfile.makedirs(f"{model_dir}/checkpoints")
    gcs.stop_server()
    try:
        with pytest.raises(StorageError, match="run_identity.json cannot be read"):
            RunDirectory(model_dir).read_json("run_identity.json")
        with pytest.raises(StorageError, match="Listing the checkpoints"):
            checkpoint_steps(f"{model_dir}/checkpoints")
        with pytest.raises(StorageError, match="creating the lock .* Rerun the same command"):
            GcsLock(model_dir, storage_timeout_seconds=2).acquire()
        with pytest.raises(StorageError, match=f"DATA_DIR='gs://{gcs_bucket}/tfds' did not answer"):
            builders.load_builder(get_dataset_spec("digits"), f"gs://{gcs_bucket}/tfds")
        try:  # Anywhere else: the line train.py prints for it (exit 6).
            tf.io.gfile.exists(f"{model_dir}/operative_config.gin")
        except tf.errors.OpError as error:
            assert outage_message(error, REPO_ROOT).startswith("the storage did not answer")
        assert outage_message(tf.errors.UnavailableError(None, None, "peer worker died"), REPO_ROOT) is None

        started = time.monotonic()
        result = run_train_py(DIGITS, "--gin_param=experiment.storage_timeout_seconds=5", f"--model_dir={model_dir}",
                              timeout=300)
        seconds = time.monotonic() - started
    finally:
        gcs.restart_server()
    assert result.returncode == 6, result.stdout[-3000:] + result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "did not answer" in errors[0] and "Traceback" not in result.stderr, result.stderr
    assert seconds < 120, seconds


def test_a_profiler_trace_is_discarded_once_the_run_may_not_write(tmp_path):
    """The trace is written at its end: after the run lost its lock (or its storage), it must not be."""
    import tensorflow as tf

    from training.observers.profiling import Profiler

    for may_write, folder in ((False, tmp_path / "lost"), (True, tmp_path / "held")):
        profiler = Profiler((0, 5), str(folder), may_write=lambda may_write=may_write: may_write)
        profiler.before_loop(0, 5)
        tf.reduce_sum(tf.range(10)).numpy()
        profiler.after_loop(5)
    assert not (tmp_path / "lost").exists()
    assert list((tmp_path / "held" / "plugins" / "profile").iterdir())  # Negative control: written when it may.
