"""Non-finite loss stops with exit 4 keeping the last good checkpoint; SIGTERM checkpoints and exits 3."""

import os
import signal
import subprocess

import numpy as np
import tensorflow as tf

import forked_python
import train
from helpers import REPO_ROOT

DIGITS = "--gin_file=configs/experiments/digits_mlp.gin"
SMALL = ["--gin_param=STEPS_PER_LOOP=5", "--gin_param=CHECKPOINT_EVERY=5", "--gin_param=EVAL_EVERY=0",
         "--gin_param=experiment.lr_schedule='constant'"]


def _checkpoint_steps(model_dir):
    state = tf.train.get_checkpoint_state(os.path.join(model_dir, "checkpoints"))
    return [int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths] if state else []


def test_non_finite_loss_exits_4_and_keeps_the_last_good_checkpoint(tmp_path, capsys, data_dir):
    model_dir = str(tmp_path)
    assert train.main(["train.py", DIGITS, *SMALL, "--gin_param=TRAIN_STEPS=10", f"--model_dir={model_dir}"]) == 0
    assert _checkpoint_steps(model_dir)[-1] == 10
    code = train.main(["train.py", DIGITS, *SMALL, "--gin_param=TRAIN_STEPS=40", "--gin_param=LEARNING_RATE=1e12",
                       f"--model_dir={model_dir}"])
    assert code == 4
    assert "Loss became nan" in capsys.readouterr().err
    assert _checkpoint_steps(model_dir)[-1] == 10  # Nothing written after the loss went bad ...
    reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints", "ckpt-10"))
    for key in reader.get_variable_to_shape_map():  # ... and the newest checkpoint is finite.
        value = reader.get_tensor(key)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            assert np.all(np.isfinite(value)), key


def test_sigterm_checkpoints_at_the_loop_boundary_and_exits_3(tmp_path, data_dir):
    model_dir = str(tmp_path)
    process = forked_python.popen([os.path.join(REPO_ROOT, "train.py"), DIGITS, *SMALL,
                                   "--gin_param=TRAIN_STEPS=1000000", f"--model_dir={model_dir}"],
                                  cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:
            if " step " in line and "/1000000" in line:  # The first loop finished: training is under way.
                process.send_signal(signal.SIGTERM)
                break
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 3, stderr
    assert "Stopped by SIGTERM" in stderr and "Rerun the same command to resume" in stderr
    steps = _checkpoint_steps(model_dir)
    assert steps and steps[-1] % 5 == 0 and steps[-1] < 1000000
