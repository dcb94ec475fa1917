"""One writer per model_dir: a second run exits 2 within seconds naming the holder; a lock left by a dead process is
taken over with a warning; released at exit. (The gs:// lock, an extra: tests/test_run_lock_gcs.py.)"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from common.errors import ConfigError
from helpers import run_train_py
from training.run_directory.lock import LOCK_NAME, LocalLock, RunDirectoryInUse

TINY = ["--gin_file=configs/experiments/digits_mlp.gin", "--gin_param=TRAIN_STEPS=10", "--gin_param=STEPS_PER_LOOP=5",
        "--gin_param=EVAL_EVERY=0", "--gin_param=experiment.lr_schedule='constant'"]
SECONDS = 40  # A refused run: Python + TensorFlow start-up (~5 s; more on a busy 2-core machine), nothing else.


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def second_run_is_refused(model_dir: str, lock, names) -> None:
    """With `lock` held by this test process (the first run), a second train.py on `model_dir` exits 2 in seconds
    naming this process and writes nothing (`names()`: what model_dir then holds, only the lock); released, the same
    command runs (the negative control)."""
    lock.acquire()
    try:
        started = time.monotonic()
        second = run_train_py(*TINY, f"--model_dir={model_dir}", timeout=120)
        elapsed = time.monotonic() - started
        assert names() == [LOCK_NAME]  # The second run wrote nothing: only the holder's lock is there.
    finally:
        lock.release()
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"is in use by another run: pid {os.getpid()} on host {socket.gethostname()}" in second.stderr
    assert "Traceback" not in second.stderr and "step " not in second.stdout
    assert elapsed < SECONDS, elapsed
    third = run_train_py(*TINY, f"--model_dir={model_dir}", timeout=300)
    assert third.returncode == 0, third.stderr[-2000:]


def test_a_second_run_on_a_held_model_dir_exits_2_naming_the_holder(tmp_path, data_dir):
    model_dir = str(tmp_path / "run")
    second_run_is_refused(model_dir, LocalLock(model_dir), lambda: os.listdir(model_dir))
    # --mode=eval beside a training run: evaluates and prints, records nothing.
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
