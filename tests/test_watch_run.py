"""Watching a run (issue 14) through train.py: progress lines with an ETA (plain and on a terminal), metrics.jsonl
across a kill and resume, the best checkpoint and export, TensorBoard's config text, hparams, images and scalars,
a PROFILE_STEPS trace read by the profile plugin's converter, and tools.compare on local and gs:// runs."""

import fcntl
import glob
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import numpy as np
import pytest

import forked_python
from helpers import REPO_ROOT, run_module, run_train_py

MLP = ["--gin_file=configs/experiments/digits_mlp.gin", "--gin_param=STEPS_PER_LOOP=10",
       "--gin_param=cosine.warmup_steps=5"]
LINE = re.compile(r"step +(\d+)/(\d+) \| .*? \| (?:first loop ([\d.]+) s incl\. compile|([\d.]+) steps/s \| [\d,]+ "
                  r"examples/s) \| elapsed (\d+:\d\d) \| ETA (\d+:\d\d|after the next loop)")


def _seconds(text: str) -> int:
    minutes, seconds = text.split(":")
    return int(minutes) * 60 + int(seconds)


def _records(model_dir: str) -> list[dict]:
    with open(os.path.join(model_dir, "metrics.jsonl")) as handle:
        return [json.loads(line) for line in handle]


# --- progress ---------------------------------------------------------------------------------------------------

def test_the_eta_is_the_remaining_steps_over_the_moving_average_without_the_first_loop():
    from training.observers.base import TrainLoop
    from training.observers.progress import WINDOW, Progress

    def loop(step, seconds):
        return TrainLoop(step=step, num_steps=100, seconds=seconds, metrics={"loss": 1.0}, learning_rate=0.1,
                         global_batch_size=64)

    now = [0.0]
    progress = Progress(1000, 64, interactive=False, clock=lambda: now[0])
    with progress.active(0):
        now[0] += 60.0  # The first loop compiles: 60 s for 100 steps, which must not count.
        progress.loop_done(loop(100, 60.0))
        assert progress.eta_seconds(100) is None
        for step, seconds in ((200, 1.0), (300, 1.0)):  # 100 steps/s.
            now[0] += seconds
            progress.loop_done(loop(step, seconds))
        rates = loop(300, 1.0).rates
        assert rates == {"steps_per_second": 100.0, "examples_per_second": 6400.0}
        assert progress.eta_seconds(300) == pytest.approx(7.0)  # 700 steps at 100 steps/s.
        line = progress.line(300, {"loss": 1.0}, 0.1, rates, seconds=1.0, first=False)
        assert "ETA 0:07" in line and "elapsed 1:02" in line and "100.0 steps/s" in line and "6,400 examples/s" in line
        for step in range(400, 400 + 100 * WINDOW, 100):  # Slower: 50 steps/s fills the window.
            progress.loop_done(loop(step, 2.0))
        assert progress.eta_seconds(800) == pytest.approx(200 / 50)


def test_plain_progress_lines_carry_a_sane_eta_and_the_first_loop_is_announced(tmp_path, data_dir):
    result = run_train_py(*MLP, "--gin_param=TRAIN_STEPS=200", "--gin_param=EVAL_EVERY=100",
                          "--gin_param=CHECKPOINT_EVERY=0", f"--model_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "\r" not in out  # Not a terminal: plain lines only.
    notice = out.index("step 0: tracing and compiling the training loop")
    lines = LINE.findall(out)
    assert [int(step) for step, *_ in lines] == list(range(10, 201, 10)), out
    assert out.index("step  10/200") > notice
    first = lines[0]
    assert first[2] and first[5] == "after the next loop"  # The compile loop: its own time, no ETA yet.
    rates = [float(rate) for *_, rate, _, _ in lines[1:]]
    for step, total, _, _, _, eta in lines[1:]:  # Between remaining/fastest and remaining/slowest loop, rounded.
        remaining = int(total) - int(step)
        assert remaining / max(rates) - 1 <= _seconds(eta) <= remaining / min(rates) + 1, (step, eta, rates)
    assert lines[-1][5] == "0:00"
    assert re.search(r"eval step 100 \([\d.]+ s\)\n.*metric +value\n.*loss +\d\.\d{4}\n.*accuracy +\d\.\d{4}", out)


@pytest.mark.slow  # ~30 s: train.py in a process of its own on a pseudo-terminal (the point: a real terminal).
def test_on_a_terminal_one_progress_line_updates_in_place(tmp_path, data_dir):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 220, 0, 0))  # 220 columns: the whole line.
    command = [sys.executable, os.path.join(REPO_ROOT, "train.py"), *MLP, "--gin_param=TRAIN_STEPS=100",
               "--gin_param=EVAL_EVERY=0", "--gin_param=CHECKPOINT_EVERY=0", f"--model_dir={tmp_path}"]
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + 240
    while time.monotonic() < deadline:
        if select.select([leader], [], [], 1.0)[0]:
            try:
                data = os.read(leader, 65536)
            except OSError:  # The child closed the terminal.
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    process.wait(timeout=60)
    os.close(leader)
    out = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 0, out[-3000:]
    assert "tracing and compiling the training loop" in out
    updates = re.findall(r"\r[^\r\n]*step +(\d+)/100 \|[^\r\n]*ETA", out)
    assert "100" in updates and len(set(updates)) >= 5, out[-3000:]  # Redrawn in place, loop after loop.
    lines = [line for line in out.replace("\r", "\n").splitlines() if re.search(r"step +\d+/100 \|", line)]
    newline_terminated = re.findall(r"^\d\d:\d\d:\d\d step +\d+/100 \|", out, re.MULTILINE)
    assert len(lines) >= 10 and not newline_terminated  # No plain log line per loop.


# --- metrics.jsonl ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_metrics_jsonl_survives_a_kill_and_resume_without_duplicates_or_gaps(tmp_path, data_dir):
    args = [*MLP, "--gin_param=TRAIN_STEPS=80", "--gin_param=EVAL_EVERY=20", "--gin_param=CHECKPOINT_EVERY=40",
            "--gin_param=experiment.lr_schedule='constant'"]
    killed, straight = str(tmp_path / "killed"), str(tmp_path / "straight")
    process = forked_python.popen([os.path.join(REPO_ROOT, "train.py"), *args, f"--model_dir={killed}"],
                                  cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in process.stdout:
            if re.search(r"step +70/80 \|", line):  # Checkpoint at 40; records up to 60 are written.
                process.send_signal(signal.SIGKILL)
                break
    finally:
        process.kill()
        process.wait(timeout=60)
    before = _records(killed)
    assert max(record["step"] for record in before) >= 60  # Records past the checkpoint it resumes from.
    resumed = run_train_py(*args, f"--model_dir={killed}")
    assert resumed.returncode == 0 and "at step 40" in resumed.stdout, resumed.stderr[-2000:]
    assert run_train_py(*args, f"--model_dir={killed}").returncode == 0  # Nothing to train: no duplicate either.
    assert run_train_py(*args, f"--model_dir={straight}").returncode == 0

    records, expected = _records(killed), _records(straight)
    keys = [(record["kind"], record["step"]) for record in records]
    assert keys == [(record["kind"], record["step"]) for record in expected]
    assert [key for key in keys if key[0] == "train"] == [("train", step) for step in range(10, 81, 10)]
    assert [key for key in keys if key[0] == "eval"] == [("eval", step) for step in (20, 40, 60, 80)]
    for record, reference in zip(records, expected, strict=True):  # The resumed run recomputed the same values.
        assert record["metrics"]["loss"] == reference["metrics"]["loss"], record
    assert all(a["time"] <= b["time"] for a, b in zip(records, records[1:], strict=False))


# --- one run that records everything: best, TensorBoard, profile -------------------------------------------------

@pytest.fixture(scope="module")
def full_run(tmp_path_factory, data_dir):
    model_dir = str(tmp_path_factory.mktemp("watch") / "a")
    result = run_train_py(*MLP, "--gin_param=TRAIN_STEPS=60", "--gin_param=EVAL_EVERY=10",
                          "--gin_param=CHECKPOINT_EVERY=20", "--gin_param=LEARNING_RATE=0.5",
                          "--gin_param=BEST_METRIC='eval/accuracy'", "--gin_param=PROFILE_STEPS=(20, 30)",
                          f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return model_dir


def _eval_accuracy(export_dir: str) -> float:
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from data import builders
    from data.registry import get_dataset_spec

    spec = get_dataset_spec("digits")
    builder = builders.load_builder(spec, os.environ["TFDS_DATA_DIR"])
    examples = tfds.as_numpy(builder.as_dataset(split=spec.eval_split, batch_size=-1))
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    classes = serve(images=tf.constant(examples["image"]))["classes"].numpy()
    return float(np.mean(classes == examples["label"]))


def test_the_best_checkpoint_and_export_are_those_of_the_best_evaluation(full_run):
    evals = [record for record in _records(full_run) if record["kind"] == "eval"]
    assert [record["step"] for record in evals] == [10, 20, 30, 40, 50, 60]
    accuracies = [record["metrics"]["accuracy"] for record in evals]
    best_step = evals[int(np.argmax(accuracies))]["step"]  # The first of equal maxima: a later tie is no better.
    best = json.load(open(os.path.join(full_run, "best", "best.json")))
    assert best["step"] == best_step and best["value"] == pytest.approx(max(accuracies)) and best["mode"] == "max"
    assert json.load(open(os.path.join(full_run, "metrics.json")))["best"]["step"] == best_step
    assert sorted(name for name in os.listdir(os.path.join(full_run, "best")) if name.endswith(".index")) == \
        [f"ckpt-{best_step}.index"]  # One best checkpoint, apart from the rotating ones.
    assert _eval_accuracy(os.path.join(full_run, "export", "best")) == pytest.approx(max(accuracies), abs=1e-6)
    assert _eval_accuracy(os.path.join(full_run, "export", "60")) == pytest.approx(accuracies[-1], abs=1e-6)


def test_a_damaged_best_checkpoint_is_exit_2_before_training_resumes(full_run, tmp_path):
    """best/ is read when the run resumes, not at the first new best mid-run (where exit 2, "before training", would
    be a lie and hours of accelerator time would be spent first). Nothing is written."""
    import shutil

    model_dir = str(tmp_path / "run")
    shutil.copytree(full_run, model_dir)
    for name in glob.glob(os.path.join(model_dir, "best", "ckpt-*.index")):
        open(name, "wb").close()
    before = sorted(os.listdir(os.path.join(model_dir, "checkpoints")))
    result = run_train_py(*MLP, "--gin_param=TRAIN_STEPS=80", "--gin_param=EVAL_EVERY=10",
                          "--gin_param=CHECKPOINT_EVERY=20", "--gin_param=LEARNING_RATE=0.5",
                          "--gin_param=BEST_METRIC='eval/accuracy'", f"--model_dir={model_dir}")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"{model_dir}/best holds checkpoint files but no intact checkpoint" in result.stderr
    assert sorted(os.listdir(os.path.join(model_dir, "checkpoints"))) == before


def _events(directory: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(directory, size_guidance={"tensors": 0})
    accumulator.Reload()
    return accumulator


def test_tensorboard_has_the_config_text_hparams_images_and_named_scalars(full_run):
    import tensorflow as tf
    from tensorboard.plugins.hparams import plugin_data_pb2

    train = _events(os.path.join(full_run, "train"))
    tags = set(train.Tags()["tensors"])
    assert {"loss", "accuracy", "learning_rate", "steps_per_second", "examples_per_second", "config/operative_gin",
            "inputs"} <= tags, tags
    assert [event.step for event in train.Tensors("steps_per_second")] == list(range(10, 61, 10))
    text = tf.make_ndarray(train.Tensors("config/operative_gin")[0].tensor_proto).item().decode()
    assert "LEARNING_RATE = 0.5" in text and "BEST_METRIC = 'eval/accuracy'" in text
    images = tf.make_ndarray(train.Tensors("inputs")[0].tensor_proto)  # [width, height, encoded PNG...]
    assert train.Tensors("inputs")[0].step == 0 and len(images) == 2 + 8
    assert tf.io.decode_png(images[2]).shape == (8, 8, 1)
    assert set(_events(os.path.join(full_run, "eval")).Tags()["tensors"]) == {"loss", "accuracy"}

    root = _events(full_run)
    start = plugin_data_pb2.HParamsPluginData.FromString(
        root.SummaryMetadata("_hparams_/session_start_info").plugin_data.content).session_start_info
    assert start.hparams["LEARNING_RATE" if "LEARNING_RATE" in start.hparams else "learning_rate"].number_value == 0.5
    assert start.hparams["model"].string_value == "mlp"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        root.SummaryMetadata("_hparams_/experiment").plugin_data.content).experiment
    assert {(info.name.group, info.name.tag) for info in experiment.metric_infos} == {("eval", "loss"),
                                                                                      ("eval", "accuracy")}


def test_profile_steps_write_a_trace_that_the_profile_plugin_reads(full_run):
    from xprof.convert import raw_to_tool_data

    traces = glob.glob(os.path.join(full_run, "plugins", "profile", "*", "*.xplane.pb"))
    assert len(traces) == 1, traces
    assert "framework_op_stats" in raw_to_tool_data.xspace_to_tool_names(traces)
    data, _ = raw_to_tool_data.xspace_to_tool_data(traces, "framework_op_stats", {})
    assert b"MatMul" in data  # The MLP's own ops were traced.


# --- compare ----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_compare_tables_three_runs_one_on_gcs_and_plots_their_curves(full_run, tmp_path, gcs, gcs_bucket):
    local, remote = str(tmp_path / "b"), f"gs://{gcs_bucket}/runs/c"
    common = [*MLP, "--gin_param=EVAL_EVERY=20", "--gin_param=CHECKPOINT_EVERY=0"]
    for model_dir, extra in ((local, ["--gin_param=TRAIN_STEPS=40"]),
                             (remote, ["--gin_param=TRAIN_STEPS=40", "--gin_param=SEED=3"])):
        result = run_train_py(*common, *extra, f"--model_dir={model_dir}")
        assert result.returncode == 0, result.stderr[-2000:]
    png = str(tmp_path / "curves.png")
    compared = run_module("tools.compare", full_run, local, remote, "--metric=eval/accuracy", f"--plot={png}")
    assert compared.returncode == 0, compared.stderr[-2000:]
    rows = {line.split("  ")[0]: line.split()[len(line.split("  ")[0].split()):]
            for line in compared.stdout.splitlines() if line.strip()}
    assert rows["setting / metric"] == [full_run, local, remote]
    assert rows["TRAIN_STEPS"] == ["60", "40", "40"] and rows["SEED"] == ["0", "0", "3"]
    assert rows["LEARNING_RATE"][0] == "0.5" and "MODEL" not in rows  # Only the differing settings.
    assert rows["step"] == ["60", "40", "40"]
    remote_evals = [record["metrics"]["accuracy"] for record in _remote_records(remote) if record["kind"] == "eval"]
    best_row = " ".join(rows["best eval/accuracy (max)"])
    assert f"{max(remote_evals):.4f} @" in best_row
    with open(png, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def _remote_records(model_dir: str) -> list[dict]:
    from training.run_directory.history import read_records

    return read_records(f"{model_dir}/metrics.jsonl")


def test_profiler_port_serves_an_on_demand_capture(tmp_path, data_dir):
    import socket

    import tensorflow as tf

    with socket.socket() as probe:  # A free loopback port.
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [os.path.join(REPO_ROOT, "train.py"), *MLP, "--gin_param=TRAIN_STEPS=100000",
               "--gin_param=EVAL_EVERY=0", "--gin_param=CHECKPOINT_EVERY=0", f"--gin_param=PROFILER_PORT={port}",
               f"--model_dir={tmp_path / 'run'}"]
    process = forked_python.popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
    try:
        for line in process.stdout:
            if re.search(r"step +\d+/100000 \|", line):  # Training runs, the server is up.
                break
        tf.profiler.experimental.client.trace(f"grpc://localhost:{port}", str(tmp_path / "capture"), 1000)
    finally:
        process.kill()
        process.wait(timeout=60)
    assert glob.glob(str(tmp_path / "capture" / "plugins" / "profile" / "*" / "*.xplane.pb"))
