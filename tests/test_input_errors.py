"""Every bad input of docs/run_directory.md's "What happens when ..." table: exit 2, one `error:` line naming the value
and the fix, no traceback, before any training step (through train.py). Resume cases damage a copy of one run trained
once per module."""

import contextlib
import os
import re
import shutil
import subprocess

import pytest

from helpers import run_train_py

ARGS = ["--gin_file=configs/experiments/digits_mlp.gin", "--gin_param=TRAIN_STEPS=10", "--gin_param=STEPS_PER_LOOP=5",
        "--gin_param=EVAL_EVERY=0", "--gin_param=experiment.lr_schedule='constant'"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir) -> str:
    model_dir = str(tmp_path_factory.mktemp("trained") / "run")
    result = run_train_py(*ARGS, f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-2000:]
    return model_dir


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _truncated_data_dir(tmp_path, data_dir) -> str:
    copy = os.path.join(tmp_path, "tfds")
    shutil.copytree(data_dir, copy)
    for root, _, names in os.walk(copy):
        for name in names:
            if "-train.tfrecord" in name:
                path = os.path.join(root, name)
                data = open(path, "rb").read()
                open(path, "wb").write(data[:len(data) // 3])
    return copy


# id -> (extra train.py arguments, or a function (tmp_path, data_dir, run) -> arguments; resumes the trained run;
#        the text stderr's one error line must contain)
CASES = {
    "gin syntax error": (["--gin_param=TRAIN_STEPS = ("], False, "Could not parse the gin configuration"),
    "include of a missing file": (["--gin_param=include 'configs/nope.gin'"], False,
                                  "includes 'configs/nope.gin', which does not exist"),
    "model setting Keras rejects": (["--gin_param=MODEL='cnn'", "--gin_param=cnn.filters=(0,)"], False,
                                    "MODEL='cnn' cannot be built for DATASET='digits'"),
    "unknown macro": (["--gin_param=FOO=1"], False, "Unknown macro FOO: no configuration uses it"),
    "misspelt macro": (["--gin_param=TRAIN_STEP=5"], False, "Unknown macro TRAIN_STEP (did you mean TRAIN_STEPS?)"),
    "infinite learning rate": (["--gin_param=LEARNING_RATE=1e999"], False,
                               "LEARNING_RATE=inf must be a finite number > 0"),
    "model_dir is a file": (lambda tmp, data, run: [f"--model_dir={tmp}/a_file"], False,
                            "is not a directory (a file is in the way)"),
    "model_dir not writable": (["--model_dir=/sys/kernel/template-run"], False,
                               "cannot be created (permission denied"),
    "DATA_DIR under a file": (lambda tmp, data, run: [f"--gin_param=DATA_DIR='{tmp}/a_file/tfds'"], False,
                              "cannot be used for 'sklearn_digits' (not a directory"),
    "DATA_DIR not writable": (["--gin_param=DATA_DIR='/sys/kernel/tfds'"], False,
                              "cannot be used for 'sklearn_digits' (permission denied"),
    "truncated train TFRecord": (lambda tmp, data, run: [f"--gin_param=DATA_DIR='{_truncated_data_dir(tmp, data)}'"],
                                 False, "a TFRecord file is truncated or corrupt"),
    "resume with another model shape": (["--gin_param=mlp.hidden_units=(32,)"], True,
                                        "mlp.hidden_units: checkpoint [256, 256], now [32]"),
    "resume with another optimizer": (["--gin_param=experiment.optimizer='adam'"], True,
                                      "experiment.optimizer: checkpoint 'sgd', now 'adam'"),
    "resume with another precision": (["--gin_param=PRECISION='mixed_bfloat16'"], True,
                                      "PRECISION: checkpoint 'float32', now 'mixed_bfloat16'"),
    "corrupt metrics.json": (lambda tmp, data, run: _write(f"{run}/metrics.json", '{"step": 1') or [], True,
                             "metrics.json is corrupt (not JSON"),
    "corrupt run_identity.json": (lambda tmp, data, run: _write(f"{run}/run_identity.json", "[]") or [], True,
                                  "run_identity.json is corrupt"),
    "export where export/ cannot be written": (
        lambda tmp, data, run: _write(f"{run}/export", "") or ["--mode=export"], True, "Exporting the SavedModel to"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_exit_2_with_one_line(case, tmp_path, data_dir, request):
    extra, resumes, expected = CASES[case]
    (tmp_path / "a_file").write_text("")
    run = str(tmp_path / "run")
    if resumes:
        shutil.copytree(request.getfixturevalue("trained"), run)
        shutil.rmtree(os.path.join(run, "export"))
    before = sorted(os.listdir(run)) if resumes else None
    arguments = extra(str(tmp_path), data_dir, run) if callable(extra) else extra
    if not any(argument.startswith("--model_dir") for argument in arguments):
        arguments = [*arguments, f"--model_dir={run}"]
    result = run_train_py(*ARGS, *arguments)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert len(errors) == 1 and expected in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr and not re.search(r"step +\d+/\d+ \|", result.stdout)  # No step ran.
    # Nothing after the error line buries it (TensorFlow warned about an abandoned restore's "unrestored values").
    assert "unrestored values" not in result.stdout + result.stderr, result.stdout[-2000:]
    if resumes:  # Nothing of the run was changed (the export case's blocked export/ is a file we made).
        assert sorted(os.listdir(run)) == sorted(before + ["export"] if "export" in case else before)
        assert not os.path.exists(os.path.join(run, "export", "10"))


@contextlib.contextmanager
def _read_only(path: str):
    """Makes `path` and everything in it immutable (chattr +i: read-only even for root), and writable again after."""
    made = subprocess.run(["chattr", "-R", "+i", path], capture_output=True, text=True)
    # Not a skip: without it the read-only cases would prove nothing (it works on this machine kind's /tmp).
    assert made.returncode == 0, f"chattr +i {path} failed ({made.stderr.strip()}): install e2fsprogs"
    try:
        yield
    finally:
        subprocess.run(["chattr", "-R", "-i", path], check=True)


@pytest.mark.parametrize("mode, code", [("train", 2), ("export", 2), ("eval", 0)])
def test_a_read_only_model_dir(mode, code, trained, tmp_path):
    """train/export: exit 2 saying it cannot be written, nothing claimed about checkpoints; eval: prints the metrics."""
    run = str(tmp_path / "run")
    shutil.copytree(trained, run)
    shutil.rmtree(os.path.join(run, "export"))
    with _read_only(run):
        result = run_train_py(*ARGS, "--gin_param=TRAIN_STEPS=20", f"--model_dir={run}", f"--mode={mode}")
    assert result.returncode == code, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    if code == 2:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "is not writable (permission denied" in errors[0], result.stderr
        assert "intact" not in errors[0]
    else:
        assert "final: {'step': 10" in result.stdout and "'accuracy'" in result.stdout
        assert "Evaluating without recording metrics.json" in result.stdout
    assert not os.path.exists(os.path.join(run, "export"))
