"""Damaged checkpoints fall back to the newest intact one, through train.py, and the resumed run ends with the
weights of an uninterrupted run; damage everywhere is exit 2 with nothing deleted.

One run of 30 steps (checkpoints at 10, 20, 30) and one uninterrupted run of 40 steps are trained once per module;
each case damages a copy of the first, resumes it to 40 and compares every weight and slot bit for bit.
"""

import os
import random
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

import forked_python
from helpers import REPO_ROOT, checkpoint_values, run_train_py

ARGS = ["--gin_file=configs/experiments/digits_mlp.gin", "--gin_param=STEPS_PER_LOOP=10",
        "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=0", "--gin_param=experiment.lr_schedule='constant'"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
    """(run trained to 30, its uninterrupted continuation's checkpoint values at 40)."""
    root = tmp_path_factory.mktemp("integrity")
    partial, straight = str(root / "partial"), str(root / "straight")
    for model_dir, steps in ((partial, 30), (straight, 40)):
        result = run_train_py(*ARGS, f"--gin_param=TRAIN_STEPS={steps}", f"--model_dir={model_dir}")
        assert result.returncode == 0, result.stderr[-2000:]
    return partial, checkpoint_values(straight)


def _copy(runs, tmp_path) -> tuple[str, str]:
    model_dir = str(tmp_path / "run")
    shutil.copytree(runs[0], model_dir)
    return model_dir, os.path.join(model_dir, "checkpoints")


def _data_file(checkpoints: str, step: int) -> str:
    return os.path.join(checkpoints, f"ckpt-{step}.data-00000-of-00001")


def _truncate(path: str) -> None:
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])


def _flip_a_bit(path: str) -> None:
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(path, "wb").write(bytes(data))


DAMAGE = {  # name -> (damage(checkpoints folder), step resumed from)
    "index deleted": (lambda c: os.remove(os.path.join(c, "ckpt-30.index")), 20),
    "index empty": (lambda c: open(os.path.join(c, "ckpt-30.index"), "wb").close(), 20),
    "index truncated": (lambda c: _truncate(os.path.join(c, "ckpt-30.index")), 20),
    "data shard truncated": (lambda c: _truncate(_data_file(c, 30)), 20),
    "data shard bit-flipped": (lambda c: _flip_a_bit(_data_file(c, 30)), 20),
    "state file deleted": (lambda c: os.remove(os.path.join(c, "checkpoint")), 30),
    "state file empty": (lambda c: open(os.path.join(c, "checkpoint"), "w").close(), 30),
    "state file garbled": (lambda c: open(os.path.join(c, "checkpoint"), "w").write("model_checkpoint_path: ckpt-"),
                           30),
    "state file names a deleted checkpoint": (lambda c: [os.remove(os.path.join(c, name)) for name in os.listdir(c)
                                                         if name.startswith("ckpt-30.")], 20),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_falls_back_and_the_resumed_run_matches_an_uninterrupted_one(damage, runs, tmp_path):
    model_dir, checkpoints = _copy(runs, tmp_path)
    damage_fn, resumed_from = DAMAGE[damage]
    damage_fn(checkpoints)
    result = run_train_py(*ARGS, "--gin_param=TRAIN_STEPS=40", f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"Resumed from {checkpoints}/ckpt-{resumed_from} at step {resumed_from}" in result.stdout, result.stdout
    if resumed_from == 20:
        assert f"Checkpoint {checkpoints}/ckpt-30 is damaged" in result.stdout
    resumed, expected = checkpoint_values(model_dir), runs[1]
    assert resumed.keys() == expected.keys() and len(resumed) > 5
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], expected[key], err_msg=key)
    assert sorted(name for name in os.listdir(checkpoints) if name.endswith(".index")) == \
        ["ckpt-20.index", "ckpt-30.index", "ckpt-40.index"]


def test_checkpoint_files_without_an_intact_one_are_exit_2_and_nothing_is_deleted(runs, tmp_path):
    model_dir, checkpoints = _copy(runs, tmp_path)
    for step in (10, 20, 30):
        os.remove(os.path.join(checkpoints, f"ckpt-{step}.index"))
    before = sorted(os.listdir(checkpoints))
    result = run_train_py(*ARGS, "--gin_param=TRAIN_STEPS=40", f"--model_dir={model_dir}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "holds checkpoint files but no intact checkpoint" in result.stderr
    assert "pass a new --model_dir" in result.stderr and "Traceback" not in result.stderr
    assert sorted(os.listdir(checkpoints)) == before  # Not started from scratch: nothing rotated away.


def test_verify_detects_each_damage_and_passes_an_intact_checkpoint(runs, tmp_path):
    from training.run_directory.checkpoints import verify

    model_dir, checkpoints = _copy(runs, tmp_path)
    assert verify(os.path.join(checkpoints, "ckpt-30")) is None  # Negative control.
    _flip_a_bit(_data_file(checkpoints, 30))
    assert "Checksum does not match" in verify(os.path.join(checkpoints, "ckpt-30"))
    _truncate(_data_file(checkpoints, 20))
    assert verify(os.path.join(checkpoints, "ckpt-20")).startswith("unreadable")
    os.remove(os.path.join(checkpoints, "ckpt-10.index"))
    assert verify(os.path.join(checkpoints, "ckpt-10")) == "its .index file is missing"


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_matches_an_uninterrupted_run(data_dir, tmp_path):
    """Killed (SIGKILL: no handler runs) at seeded random moments of training, checkpoint writes included, then
    rerun to the end: the weights equal the uninterrupted run's, bit for bit, and a dead run's lock is taken over.

    Attempt k is killed `delay` seconds after it logs a step at or past k * 80 of 300 (a loop is ~35 ms here, so
    the longest delay, 50 ms, overshoots by ~15 steps, far short of the next target): every attempt is killed
    mid-run whatever it resumed from. Timing by wall clock alone let one long delay finish the run early, which
    left later attempts nothing to kill (1 CI run in 3)."""
    steps = 300
    model_dir, straight = str(tmp_path / "run"), str(tmp_path / "straight")
    command = [os.path.join(REPO_ROOT, "train.py"), *ARGS, f"--gin_param=TRAIN_STEPS={steps}",
               f"--model_dir={model_dir}"]
    delays = random.Random(11).sample([0.0, 0.005, 0.01, 0.02, 0.03, 0.05], 3)
    killed = 0
    for attempt, delay in enumerate(delays, start=1):
        process = forked_python.popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True)
        try:
            for line in process.stdout:
                logged = re.search(rf" step +(\d+)/{steps} \|", line)
                if logged and int(logged.group(1)) >= attempt * 80:
                    time.sleep(delay)
                    process.kill()
                    break
        finally:
            process.kill()
            killed += process.wait(timeout=60) == -signal.SIGKILL
    assert killed == len(delays)  # Every attempt died mid-run (a finished run exits 0).
    final = run_train_py(*ARGS, f"--gin_param=TRAIN_STEPS={steps}", f"--model_dir={model_dir}")
    assert final.returncode == 0, final.stderr[-2000:]
    resumed_at = re.search(r"Resumed from \S+ at step (\d+)", final.stdout)
    assert resumed_at and int(resumed_at.group(1)) >= 3 * 80 - 10, final.stdout  # At most the killed loop is lost.
    uninterrupted = run_train_py(*ARGS, f"--gin_param=TRAIN_STEPS={steps}", f"--model_dir={straight}")
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-2000:]
    resumed, expected = checkpoint_values(model_dir), checkpoint_values(straight)
    assert resumed.keys() == expected.keys() and len(expected) > 4
    for key in expected:
        np.testing.assert_array_equal(resumed[key], expected[key], err_msg=key)


def test_a_checkpoint_holding_nan_counts_as_damaged(tmp_path):
    """A non-finite checkpoint (as older versions could save) is never resumed: verify() rejects it."""
    import tensorflow as tf

    from training.run_directory.checkpoints import verify

    weights = tf.Variable(np.ones(4, np.float32))
    finite = tf.train.Checkpoint(weights=weights).write(str(tmp_path / "ckpt-1"))
    weights.assign([1.0, np.nan, 1.0, 1.0])
    poisoned = tf.train.Checkpoint(weights=weights).write(str(tmp_path / "ckpt-2"))
    assert verify(finite) is None
    assert verify(poisoned).startswith("holds non-finite values")


@pytest.mark.parametrize("error", ["UnavailableError", "DeadlineExceededError", "PermissionDeniedError"])
def test_a_storage_that_does_not_answer_is_not_a_damaged_checkpoint(error, runs, tmp_path, monkeypatch):
    """A gs:// outage while the newest checkpoint is read must not skip it and resume from an older one (losing the
    steps between): it is a StorageError and nothing changes. The outage is simulated (TensorFlow's reader raises
    the error gs:// gives) since taking a real server down between two reads is not deterministic; a real damaged
    file still falls back (the control, above and here)."""
    import tensorflow as tf

    from common.errors import StorageError
    from training.run_directory import checkpoints

    model_dir, directory = _copy(runs, tmp_path)
    state_before = open(os.path.join(directory, "checkpoint")).read()
    real_load = tf.train.load_checkpoint

    def flaky_load(prefix):
        if prefix.endswith("ckpt-30"):
            raise getattr(tf.errors, error)(None, None, "Error executing an HTTP request: couldn't connect")
        return real_load(prefix)

    monkeypatch.setattr(tf.train, "load_checkpoint", flaky_load)
    store = checkpoints.CheckpointStore(tf.train.Checkpoint(), read_dir=directory, write_dir=directory, keep=3)
    with pytest.raises(StorageError, match="ckpt-30 failed .* whether it is intact is unknown"):
        store.find_restorable()
    assert open(os.path.join(directory, "checkpoint")).read() == state_before
    monkeypatch.setattr(tf.train, "load_checkpoint", real_load)
    _flip_a_bit(_data_file(directory, 30))  # Control: real damage still falls back to step 20.
    assert store.find_restorable() == os.path.join(directory, "ckpt-20")
