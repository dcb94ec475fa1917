"""No non-finite checkpoint is ever written, exit 4 names the newest finite one, a rerun with a sane rate resumes
from it; a finite but exploding loss gets a divergence warning."""

import os

import numpy as np
import pytest
import tensorflow as tf

from helpers import run_train_py

ARGS = ["--gin_file=configs/experiments/digits_mlp.gin", "--gin_param=EVAL_EVERY=0",
        "--gin_param=experiment.lr_schedule='constant'"]


def _finite_checkpoint_steps(checkpoints: str) -> list[int]:
    """Steps of the checkpoints on disk; asserts every floating-point value in each is finite."""
    steps = sorted(int(name[len("ckpt-"):-len(".index")]) for name in os.listdir(checkpoints)
                   if name.endswith(".index"))
    for step in steps:
        reader = tf.train.load_checkpoint(os.path.join(checkpoints, f"ckpt-{step}"))
        for key in reader.get_variable_to_shape_map():
            value = reader.get_tensor(key)
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                assert np.all(np.isfinite(value)), (step, key)
    return steps


def test_a_huge_learning_rate_leaves_no_non_finite_checkpoint_and_a_sane_rerun_resumes(tmp_path, data_dir):
    model_dir, checkpoints = str(tmp_path / "run"), str(tmp_path / "run" / "checkpoints")
    loop_of_one = ["--gin_param=STEPS_PER_LOOP=1", "--gin_param=CHECKPOINT_EVERY=1"]
    first = run_train_py(*ARGS, *loop_of_one, "--gin_param=TRAIN_STEPS=10", f"--model_dir={model_dir}")
    assert first.returncode == 0, first.stderr[-2000:]

    exploded = run_train_py(*ARGS, *loop_of_one, "--gin_param=TRAIN_STEPS=20", "--gin_param=LEARNING_RATE=1e39",
                            f"--model_dir={model_dir}")
    assert exploded.returncode == 4, exploded.stdout[-2000:] + exploded.stderr[-2000:]
    # The loss of step 11 is computed before its update, so it is finite: the weights check is what stops it.
    assert "Weights or optimizer state became non-finite (dense/kernel" in exploded.stderr
    assert "between steps 10 and 11; nothing was saved since" in exploded.stderr
    assert f"The newest finite checkpoint is {checkpoints}/ckpt-10" in exploded.stderr, exploded.stderr
    assert _finite_checkpoint_steps(checkpoints) == [8, 9, 10]  # Nothing written after step 10.

    sane = run_train_py(*ARGS, *loop_of_one, "--gin_param=TRAIN_STEPS=12", f"--model_dir={model_dir}")
    assert sane.returncode == 0, sane.stderr[-2000:]
    assert f"Resumed from {checkpoints}/ckpt-10 at step 10" in sane.stdout
    assert _finite_checkpoint_steps(checkpoints) == [10, 11, 12]


def test_non_finite_before_any_checkpoint_says_the_rerun_starts_over(tmp_path, data_dir):
    result = run_train_py(*ARGS, "--gin_param=STEPS_PER_LOOP=1", "--gin_param=TRAIN_STEPS=5",
                          "--gin_param=LEARNING_RATE=1e39", f"--model_dir={tmp_path / 'run'}")
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert "No checkpoint was written yet. Lower LEARNING_RATE or set experiment.clip_global_norm, then rerun: it " \
           "starts from step 0." in result.stderr, result.stderr[-2000:]
    assert "newest finite checkpoint" not in result.stderr


@pytest.mark.parametrize("multiplier, warned", [(1000.0, True), (1.0, False)])
def test_a_finite_but_exploding_loss_gets_a_divergence_warning(multiplier, warned, tmp_path, data_dir):
    """Float64, 20 steps at the shipped 0.05 (the loss falls to ~0.3), then `multiplier` times that: at 50 the loss
    explodes past 1e37 within 10 steps (seeds 0, 1, 2: 1e41 to 1e57 at its worst, measured), past float32's range and
    far from float64's, so it stays finite and the run ends with exit 0 and the warning (whatever the data order:
    chaotic learning rates such as a constant 5 go to NaN or recover depending on it). TensorBoard, which stores
    float32, records inf; that write once failed the run."""
    result = run_train_py("--gin_file=configs/experiments/digits_mlp.gin", "--gin_param=EVAL_EVERY=0",
                          "--gin_param=experiment.lr_schedule='step'", "--gin_param=step.boundaries=[20]",
                          f"--gin_param=step.multipliers=[1.0, {multiplier}]", "--gin_param=PRECISION='float64'",
                          "--gin_param=STEPS_PER_LOOP=5", "--gin_param=CHECKPOINT_EVERY=0",
                          "--gin_param=TRAIN_STEPS=40", "--gin_param=LEARNING_RATE=0.05", f"--model_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]  # Finite all along: a warning, not an exit.
    assert ("Training is diverging" in result.stdout) is warned, result.stdout[-3000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "train"), size_guidance={"tensors": 0})
    events.Reload()
    losses = {event.step: float(tf.make_ndarray(event.tensor_proto)) for event in events.Tensors("loss")}
    assert sorted(losses) == [5, 10, 15, 20, 25, 30, 35, 40] and losses[20] < 1, losses
    assert any(np.isinf(loss) for loss in losses.values()) == warned, losses  # Past float32's range: inf.


def test_the_finite_check_sees_a_nan_in_any_variable():
    from training.observers.health import make_finite_check, non_finite_names

    weights, slot = tf.Variable(np.ones(3, np.float32), name="w"), tf.Variable(np.zeros(2, np.float32), name="m")
    steps = tf.Variable(3, dtype=tf.int64, name="iterations")
    all_finite = make_finite_check([weights, slot, steps])
    assert all_finite()
    slot.assign([0.0, np.nan])
    assert not all_finite() and non_finite_names([weights, slot, steps]) == ["m:0"]
    slot.assign([0.0, 0.0])
    weights.assign([np.inf, 0.0, 0.0])
    assert not all_finite()


def test_divergence_monitor_warns_once_per_hundredfold_growth(caplog):
    from training.observers.health import DivergenceMonitor

    monitor = DivergenceMonitor()
    losses = {5: 2.3, 10: 0.5, 15: 30.0, 20: 60.0, 25: 600.0, 30: 6000.0, 35: 0.4}
    flagged = [step for step, loss in losses.items() if monitor.observe(step, loss)]
    assert flagged == [20, 25, 30]  # 30.0 is 60x the lowest (0.5): not yet.
    assert len([record for record in caplog.records if "diverging" in record.getMessage()]) == 2
