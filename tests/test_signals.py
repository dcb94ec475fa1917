"""SIGTERM/SIGINT/SIGHUP are honoured from process start to exit: at start-up exit 3 with nothing written; after the
final evaluation exit 3 with the final checkpoint written, and the rerun finishes the export. A single SIGINT is never
reported as a second interrupt. A closed terminal (SIGHUP) checkpoints like SIGTERM; under nohup it is ignored."""

import os
import signal
import subprocess
import sys

import pytest

import forked_python
from helpers import REPO_ROOT, run_train_py

ARGS = ["--gin_file=configs/experiments/digits_mlp.gin", "--gin_param=TRAIN_STEPS=20", "--gin_param=STEPS_PER_LOOP=10",
        "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=0", "--gin_param=experiment.lr_schedule='constant'"]


def _signal_when(model_dir: str, marker: str, signum: int) -> tuple[int, str, str]:
    """Runs train.py, sends `signum` as soon as a stdout line contains `marker`; returns (code, stdout, stderr)."""
    process = forked_python.popen([os.path.join(REPO_ROOT, "train.py"), *ARGS, f"--model_dir={model_dir}"],
                                  cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    from training.run_directory.checkpoints import verify

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

    process = forked_python.popen([os.path.join(REPO_ROOT, "train.py"), *ARGS, "--gin_param=TRAIN_STEPS=400000",
                                   "--gin_param=STEPS_PER_LOOP=200000", "--gin_param=CHECKPOINT_EVERY=0",
                                   f"--model_dir={tmp_path / 'run'}"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
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


LONG = ["--gin_param=TRAIN_STEPS=100000", "--gin_param=STEPS_PER_LOOP=20", "--gin_param=CHECKPOINT_EVERY=0"]


@pytest.mark.slow
def test_closing_the_terminal_checkpoints_and_exits_3_and_the_rerun_resumes_exactly(tmp_path, data_dir):
    """A terminal (or SSH session) that closes while train.py runs in it, without nohup: the kernel hangs the
    terminal up and sends SIGHUP, which by default ended the run with every step since the last checkpoint lost.
    Here train.py runs in a pseudo-terminal of its own (its session leader, the terminal its controlling one, sized
    so the progress line is the interactive one) and the test closes that terminal once training is under way: the
    run saves a checkpoint at the next loop boundary and exits 3, although every write to the terminal now fails;
    the rerun continues from it bit for bit as an uninterrupted run."""
    import numpy as np
    import tensorflow as tf

    from helpers import checkpoint_values, read_terminal_until, start_in_own_terminal

    model_dir = str(tmp_path / "hung_up")
    process, master = start_in_own_terminal([sys.executable, os.path.join(REPO_ROOT, "train.py"), *ARGS, *LONG,
                                             f"--model_dir={model_dir}"], columns=160)
    try:
        read_terminal_until(master, rb" 20/100000 \|")  # The first loop is done: training is under way.
        os.close(master)  # The terminal closes: SIGHUP.
        code = process.wait(timeout=120)
    finally:
        process.kill()
    assert code == 3, code  # Not -1 (killed by SIGHUP), not 1 (crashed writing to the closed terminal).
    stopped = int(tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")).rsplit("-", 1)[1])
    assert stopped % 20 == 0 and 20 <= stopped < 100000
    more = [*ARGS, f"--gin_param=TRAIN_STEPS={stopped + 20}", "--gin_param=STEPS_PER_LOOP=20",
            "--gin_param=CHECKPOINT_EVERY=20"]
    resumed = run_train_py(*more, f"--model_dir={model_dir}")
    assert resumed.returncode == 0 and f"at step {stopped}" in resumed.stdout, resumed.stderr[-2000:]
    straight = run_train_py(*more, f"--model_dir={tmp_path / 'straight'}")
    assert straight.returncode == 0, straight.stderr[-2000:]
    first, second = checkpoint_values(model_dir), checkpoint_values(str(tmp_path / "straight"))
    assert first.keys() == second.keys() and len(first) > 4
    for key in first:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)


def test_sighup_is_a_sigterm_and_stays_ignored_under_nohup(tmp_path, data_dir):
    """`kill -HUP` stops the run like SIGTERM (checkpoint, exit 3, its name in the message). Started with SIGHUP
    ignored (as `nohup` starts it, and the TPU VM launcher's `setsid nohup`), a hang-up is ignored: it trains on."""
    model_dir = str(tmp_path / "run")
    code, stdout, stderr = _signal_when(model_dir, "eval step", signal.SIGHUP)  # Exit 3 checked below.
    assert code == 3 and "Stopped by SIGHUP" in stderr, stdout[-2000:] + stderr[-2000:]

    process = subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "train.py"), *ARGS, *LONG,
                                f"--model_dir={tmp_path / 'nohup'}"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if " 20/100000 |" in line:
                process.send_signal(signal.SIGHUP)
            if " 80/100000 |" in line:  # Two loops past the one the SIGHUP could have stopped at.
                process.send_signal(signal.SIGTERM)
                break
        output = "".join(lines) + process.communicate(timeout=120)[0]
    finally:
        process.kill()
    assert process.returncode == 3 and "Stopped by SIGTERM" in output and "SIGHUP" not in output, output[-3000:]
