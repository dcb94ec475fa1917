"""SIGTERM/SIGINT are honoured from process start to exit: at start-up exit 3 with nothing written; after the final
evaluation exit 3 with the final checkpoint written, and the rerun finishes the export. A single SIGINT is never
reported as a second interrupt."""

import os
import signal
import subprocess
import sys

import pytest

from helpers import REPO_ROOT, run_train_py

ARGS = ["--gin_file=configs/experiments/digits_mlp.gin", "--gin_param=TRAIN_STEPS=20", "--gin_param=STEPS_PER_LOOP=10",
        "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=0", "--gin_param=experiment.lr_schedule='constant'"]


def _signal_when(model_dir: str, marker: str, signum: int) -> tuple[int, str, str]:
    """Runs train.py, sends `signum` as soon as a stdout line contains `marker`; returns (code, stdout, stderr)."""
    process = subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "train.py"), *ARGS,
                                f"--model_dir={model_dir}"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if marker in line:
                process.send_signal(signum)
                break
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    return process.returncode, "".join(lines) + stdout, stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_at_start_up_exits_3_without_writing(signum, tmp_path, data_dir):
    model_dir = str(tmp_path / "run")
    code, stdout, stderr = _signal_when(model_dir, "model_dir:", signum)  # Printed once the config is parsed.
    assert code == 3, stdout[-2000:] + stderr[-2000:]
    assert f"Stopped by {signal.Signals(signum).name} before training started; nothing was written" in stderr
    assert "second interrupt" not in stderr and "Traceback" not in stderr
    assert not os.path.exists(model_dir)


def test_sigterm_after_the_final_evaluation_saves_the_checkpoint_and_the_rerun_exports(tmp_path, data_dir):
    model_dir = str(tmp_path / "run")
    code, stdout, stderr = _signal_when(model_dir, "eval step 20", signal.SIGTERM)
    assert code == 3, stdout[-2000:] + stderr[-2000:]
    assert "Stopped by SIGTERM after the" in stderr and "ckpt-20 saved" in stderr, stderr
    from training.checkpoints import verify

    assert verify(os.path.join(model_dir, "checkpoints", "ckpt-20")) is None
    export = os.path.join(model_dir, "export", "20")
    assert not os.path.exists(export) or os.path.isfile(os.path.join(export, "saved_model.pb"))

    rerun = run_train_py(*ARGS, f"--model_dir={model_dir}")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "Resumed from" in rerun.stdout and "at step 20" in rerun.stdout and "nothing to train" in rerun.stdout
    assert os.path.isfile(os.path.join(export, "saved_model.pb"))


def test_a_second_signal_inside_a_long_loop_stops_at_once(tmp_path, data_dir):
    """Python handlers wait for the on-device loop to return; the watcher thread does not. The first SIGTERM is
    logged as it arrives, the second ends the process (exit 3) long before the loop of 200,000 steps could end."""
    import time

    process = subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "train.py"), *ARGS,
                                "--gin_param=TRAIN_STEPS=400000", "--gin_param=STEPS_PER_LOOP=200000",
                                "--gin_param=CHECKPOINT_EVERY=0", f"--model_dir={tmp_path / 'run'}"], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if "tracing and compiling" in line:
                break
        time.sleep(4)  # Inside the first loop (it takes minutes).
        process.send_signal(signal.SIGTERM)
        time.sleep(2)
        sent_again = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        waited = time.monotonic() - sent_again
    finally:
        process.kill()
    output = "".join(lines) + output
    assert process.returncode == 3, output[-2000:]
    assert waited < 20, waited  # At once, not at the end of the loop.
    assert "SIGTERM received: stopping at the next point" in output and "received again: stopping at once" in output
    assert "step 200000" not in output
