"""MultiWorkerMirroredStrategy through the local launcher: real worker processes talking gRPC on 127.0.0.1.

What matters: two workers train exactly what one process trains with the same global batch (every weight and
optimizer slot within 1e-9 in float64, with synchronized BatchNormalization), only the chief writes
model_dir, non-chief temporary folders are removed, a stop on one worker stops all of them at the same loop
boundary, a failed worker brings the job down, and a worker whose peer never starts gives up in bounded time.
"""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from scripts.local_cluster import LocalJob, tf_configs
from tests.helpers import REPO_ROOT, read_terminal_until, run_train_py, start_in_own_terminal
from training.replica_invariance import TOLERANCE as TOLERANCE_FLOAT64

# Compared in float64, as training.replica_invariance compares replica counts: in float32 two runs that are equal in
# exact math part once one ReLU input lands within rounding of zero (docs/correctness.md, "Why float64"). This test
# met it: at 20 float32 steps the two workers' momentum slots differed from one process's by 1.6e-3, the same figure
# on every run, and by 7.7e-7 at step 10. In float64 the same comparison gives ~3e-15 after 60 steps.
TOLERANCE = TOLERANCE_FLOAT64
# default.gin (the CNN) at its own learning rate, momentum and 50-step warm-up, for 10 steps past the warm-up, in two
# loops (checkpoints at both, so the test can look at step 30 too); synchronized BatchNormalization so that
# per-replica batch statistics, a legitimate difference, do not hide a real one; an L2 regularizer and a clip that
# binds (the initial gradient norm is ~0.95) so that a regularization loss or a clip applied per worker shows too.
CNN_ARGS = ("--gin_param=TRAIN_STEPS=60", "--gin_param=STEPS_PER_LOOP=30", "--gin_param=EVAL_EVERY=0",
            "--gin_param=CHECKPOINT_EVERY=30", "--gin_param=PRECISION='float64'",
            "--gin_param=cnn.synchronized_batch_norm=True", "--gin_param=cnn.kernel_l2=1e-3",
            "--gin_param=experiment.clip_global_norm=0.5")


def _launch(*train_args: str, workers: int = 2, env: dict | None = None, session: bool = False) -> subprocess.Popen:
    """The launcher; `session`: in a process group of its own, as a terminal runs it (so a test can Ctrl-C it)."""
    launcher = os.path.join(REPO_ROOT, "scripts", "launch_local.py")
    return subprocess.Popen([sys.executable, launcher, f"--workers={workers}", "--", *train_args],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=session)


def _checkpoint_tensors(model_dir: str, step: int | None = None) -> dict:
    """Every float tensor of a checkpoint in model_dir/checkpoints (the latest, or the one at `step`)."""
    directory = os.path.join(model_dir, "checkpoints")
    path = os.path.join(directory, f"ckpt-{step}") if step else tf.train.latest_checkpoint(directory)
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH" and np.issubdtype(reader.get_tensor(name).dtype, np.floating)}


def _worst_relative_difference(first: dict, second: dict) -> float:
    assert first.keys() == second.keys() and first
    return max(float(np.max(np.abs(first[name] - second[name])) / max(np.max(np.abs(first[name])), 1e-30))
               for name in first)


@pytest.mark.slow
def test_two_workers_equal_one_process_and_only_the_chief_writes(tmp_path, data_dir):
    worker_tmp = tmp_path / "worker_tmp"
    worker_tmp.mkdir()
    launcher = _launch(*CNN_ARGS, f"--model_dir={tmp_path / 'two'}", env={"TMPDIR": str(worker_tmp)})
    output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, output
    reference = run_train_py(*CNN_ARGS, f"--model_dir={tmp_path / 'one'}", "--gin_param=STRATEGY='default'")
    assert reference.returncode == 0, reference.stderr

    two, one = _checkpoint_tensors(str(tmp_path / "two")), _checkpoint_tensors(str(tmp_path / "one"))
    assert _worst_relative_difference(one, two) <= TOLERANCE
    # Negative control: the same comparison tells one loop of training apart, so it is not vacuous.
    assert _worst_relative_difference(_checkpoint_tensors(str(tmp_path / "one"), step=30), two) > 100 * TOLERANCE

    # Both workers measured their replicas' weights equal at the end (an all-reduce across the two processes).
    agreement = re.findall(r"\[worker (\d)\] .*Replica weights: the 2 replicas' copies differ by at most (\S+)", output)
    assert sorted(worker for worker, _ in agreement) == ["0", "1"] and all(float(v) == 0.0 for _, v in agreement)
    # Only the chief wrote model_dir; the non-chief's temporary folder is gone.
    assert sorted(os.listdir(tmp_path / "two" / "export")) == ["60"]
    assert "[worker 1] " in output and "Not the chief: this worker saves to" in output
    assert not os.listdir(worker_tmp), os.listdir(worker_tmp)
    for name in ("metrics.json", "operative_config.gin", "command.txt"):
        assert (tmp_path / "two" / name).exists()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


@pytest.mark.slow
def test_sigterm_to_one_worker_stops_both_at_the_same_loop_boundary(tmp_path, data_dir):
    launcher = _launch("--gin_param=TRAIN_STEPS=100000", "--gin_param=STEPS_PER_LOOP=20", "--gin_param=EVAL_EVERY=0",
                       "--gin_param=CHECKPOINT_EVERY=0", "--gin_param=MODEL='mlp'", f"--model_dir={tmp_path}")
    lines = []
    for line in launcher.stdout:
        lines.append(line)
        if re.match(r"\[worker 0\] .* step +\d+/100000", line):  # Only the chief prints progress.
            break
    workers = _children(launcher.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGTERM)  # Only the non-chief hears it.
    output = "".join(lines) + launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 3, output
    stops = dict(re.findall(r"\[worker (\d)\] error: Stopped by (?:SIGTERM|another worker) at step (\d+)", output))
    assert stops.keys() == {"0", "1"} and stops["0"] == stops["1"], output
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith(f"ckpt-{stops['0']}")


LONG_RUN = ("--gin_param=TRAIN_STEPS=100000", "--gin_param=STEPS_PER_LOOP=20", "--gin_param=EVAL_EVERY=0",
            "--gin_param=CHECKPOINT_EVERY=0", "--gin_param=MODEL='mlp'")


def _until_training(launcher: subprocess.Popen) -> list[str]:
    lines = []
    for line in launcher.stdout:
        lines.append(line)
        if re.match(r"\[worker 0\] .* step +\d+/100000", line):
            return lines
    raise AssertionError("".join(lines))


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_stops_both_workers_after_a_checkpoint(tmp_path, data_dir):
    """A terminal's Ctrl-C is SIGINT to the whole foreground process group. The workers run in their own session, so
    only the launcher gets it and passes one SIGTERM on: both stop at one loop boundary with a checkpoint, none
    counts two signals and stops at once (which lost the steps since the last checkpoint)."""
    launcher = _launch(*LONG_RUN, f"--model_dir={tmp_path}", session=True)
    lines = _until_training(launcher)
    os.killpg(launcher.pid, signal.SIGINT)
    output = "".join(lines) + launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 3, output
    assert "received again" not in output and "stopping the others" not in output, output
    stops = dict(re.findall(r"\[worker (\d)\] error: Stopped by (?:SIGTERM|another worker) at step (\d+)", output))
    assert stops.keys() == {"0", "1"} and stops["0"] == stops["1"], output
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith(f"ckpt-{stops['0']}")


def test_a_failed_worker_stops_the_others_and_sets_the_exit_code(capsys):
    # Worker 0 fails at once; worker 1 ignores SIGTERM (as a worker blocked in a collective would) and gets SIGKILL.
    script = ("import os, signal, sys, time, json\n"
              "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "print('started', flush=True)\n"
              "time.sleep(0.5)\n"
              "sys.exit(7) if index == 0 else time.sleep(600)\n")
    started = time.monotonic()
    job = LocalJob([sys.executable, "-c", script], num_workers=2, grace_seconds=1.0)
    assert job.wait() == 7
    assert time.monotonic() - started < 30
    assert job.processes[1].returncode == -signal.SIGKILL
    output = capsys.readouterr().out
    assert "[worker 0] started" in output and "[worker 1] started" in output
    assert "[launcher] worker 0 exited with code 7; stopping the others." in output


def test_tf_configs_name_one_loopback_cluster():
    import json

    configs = [json.loads(text) for text in tf_configs(3)]
    assert [config["task"] for config in configs] == [{"type": "worker", "index": index} for index in range(3)]
    addresses = configs[0]["cluster"]["worker"]
    assert all(config["cluster"]["worker"] == addresses for config in configs)
    assert len(set(addresses)) == 3 and all(address.startswith("127.0.0.1:") for address in addresses)


@pytest.mark.parametrize("index", [0, 1])
def test_a_worker_whose_peer_never_starts_gives_up_in_bounded_time(index, tmp_path, data_dir):
    started = time.monotonic()
    result = run_train_py("--gin_param=STRATEGY='multi_worker_mirrored'",
                          "--gin_param=experiment.startup_timeout_seconds=5", f"--model_dir={tmp_path}",
                          timeout=120, env={"TF_CONFIG": tf_configs(2)[index]})
    assert time.monotonic() - started < 60
    assert result.returncode == 1
    assert "Waiting for the 2 workers of TF_CONFIG to connect" in result.stdout
    assert "Timeout (0:00:05)!" in result.stderr and "collective_all_reduce_strategy.py" in result.stderr
    assert not os.listdir(tmp_path)  # Nothing written before the cluster was up.


_HANGING_EXIT = """
import atexit, sys, threading, time
sys.path.insert(0, {root!r})
import train
train.TEARDOWN_SECONDS = 1
atexit.register(lambda: time.sleep(3600))  # An exit handler that never returns.
threading.Thread(target=time.sleep, args=(3600,)).start()  # A non-daemon thread the interpreter would wait for.
train.exit_process(3)
"""


@pytest.mark.parametrize("tf_config, ends", [('{"cluster": {}}', True), ("", False)])
def test_a_worker_ends_with_its_exit_code_even_if_teardown_hangs(tf_config, ends):
    """With TF_CONFIG set, train.exit_process ends the process with its code although an exit handler and a
    non-daemon thread never finish (what a worker hanging after its last checkpoint looked like). Negative control:
    without TF_CONFIG (an ordinary sys.exit) the same process hangs."""
    process = subprocess.Popen([sys.executable, "-c", _HANGING_EXIT.format(root=REPO_ROOT)], stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "TF_CONFIG": tf_config})
    try:
        _, stderr = process.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        assert not ends, "the worker hung in its teardown"
        return
    assert ends, "an ordinary exit did not wait for its non-daemon thread: this control shows nothing"
    assert process.returncode == 3, stderr
    assert "exit handlers still running after 1 s; exiting without them." in stderr


@pytest.mark.slow
def test_closing_the_launchers_terminal_stops_both_workers_after_a_checkpoint(tmp_path, data_dir):
    """The launcher runs in a terminal of its own (a pseudo-terminal; the launcher its session leader) that the test
    closes once training is under way: the kernel sends SIGHUP, which by default killed the launcher and left the
    workers writing into a pipe nobody read. It is passed on as SIGTERM: both workers checkpoint (there is no
    periodic checkpoint: CHECKPOINT_EVERY=0) and the launcher, its output now going nowhere, exits 3."""
    launcher, master = start_in_own_terminal([sys.executable, os.path.join(REPO_ROOT, "scripts", "launch_local.py"),
                                              "--workers=2", "--", *LONG_RUN, f"--model_dir={tmp_path}"])
    workers = []
    try:
        read_terminal_until(master, rb"\[worker 0\] .* step +\d+/100000")
        workers = _children(launcher.pid)
        os.close(master)  # The terminal closes: SIGHUP to the launcher.
        code = launcher.wait(timeout=120)
    finally:
        launcher.kill()
        for worker in workers:  # Left running if the launcher died without passing the stop on.
            try:
                os.kill(worker, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert code == 3, code
    latest = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
    assert latest and int(latest.rsplit("-", 1)[1]) % 20 == 0
