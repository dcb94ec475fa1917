"""EMA of the weights (EMA_DECAY, training/learning/ema.py): the average is the documented recurrence, resumes bit for
bit, is what evaluation reports under the usual names and what export/<step>/ and export/best/ serve, agrees across
replica counts in float64, and is absent (checkpoint and run_identity.json unchanged) when off."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from common.errors import ConfigError
from helpers import checkpoint_values, run_train_py, shipped_config
from training.learning.ema import decay_at

DIGITS = "--gin_file=configs/experiments/digits_mlp.gin"
COMMON = [DIGITS, "--gin_param=STEPS_PER_LOOP=5", "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=10",
          "--gin_param=GLOBAL_BATCH_SIZE=32", "--gin_param=experiment.optimizer='adam'",
          "--gin_param=experiment.lr_schedule='constant'", "--gin_param=LEARNING_RATE=0.01"]
EMA = "--gin_param=EMA_DECAY=0.9"


def _trainer(small_config, replicas: int, **overrides):
    from tpu_utils.strategy import make_strategy
    from training.trainer import Trainer

    strategy = make_strategy("mirrored", virtual_devices=replicas) if replicas > 1 else make_strategy("default")
    return Trainer(small_config(**{"strategy": "mirrored" if replicas > 1 else "default", **overrides}), strategy)


def test_the_average_is_the_documented_recurrence(small_config):
    """float64, 2 replicas: after each of 8 one-step loops, every average equals the NumPy recurrence over the
    per-step weights (d_0 = 0, then min(EMA_DECAY, (1 + t) / (10 + t))) to 1e-12 relative; a fixed-decay
    recurrence (no warm-up) is far off (negative control)."""
    trainer = _trainer(small_config, 2, precision="float64", ema_decay=0.95, steps_per_loop=1)
    iterator = trainer.train_iterator()
    expected = [average.numpy() for average in trainer.ema.averages]  # Irrelevant: the first update copies.
    fixed = list(expected)
    for t in range(8):
        trainer.train(iterator, 1)
        weights = [variable.numpy() for variable in trainer.trainable_variables]
        d = decay_at(t, 0.95)
        expected = [d * e + (1 - d) * w for e, w in zip(expected, weights, strict=True)]
        fixed = [w if t == 0 else 0.95 * f + 0.05 * w for f, w in zip(fixed, weights, strict=True)]
    assert int(trainer.ema.updates.numpy()) == 8
    for average, want in zip(trainer.ema.averages, expected, strict=True):
        copies = [copy.numpy() for copy in average.values]  # Each replica's copy.
        scale = np.max(np.abs(want))
        assert all(np.max(np.abs(copy - want)) <= 1e-12 * scale for copy in copies), average.name
    pairs = list(zip(trainer.ema.averages, fixed, trainer.trainable_variables, strict=True))
    assert max(np.max(np.abs(a.numpy() - f)) / np.max(np.abs(f)) for a, f, _ in pairs) > 1e-3
    # The weights themselves are not the average (the average lags them).
    assert max(np.max(np.abs(a.numpy() - w.numpy())) for a, _, w in pairs) > 1e-4


def test_evaluation_reports_the_ema_model_and_the_raw_one_and_swaps_back_bit_for_bit(small_config):
    trainer = _trainer(small_config, 1, ema_decay=0.9, train_steps=10)
    trainer.train(trainer.train_iterator(), 10)
    weights = [variable.numpy() for variable in trainer.model.weights]
    evaluation = trainer.evaluate()
    assert set(evaluation) == {"loss", "accuracy", "raw_loss", "raw_accuracy"}
    for variable, before in zip(trainer.model.weights, weights, strict=True):
        np.testing.assert_array_equal(variable.numpy(), before)  # Swapped back exactly.
    with trainer.serving_weights():
        ema_loss = trainer._evaluate_once()["loss"]
    raw_loss = trainer._evaluate_once()["loss"]
    assert evaluation["loss"] == ema_loss and evaluation["raw_loss"] == raw_loss
    assert ema_loss != raw_loss  # Negative control: two different models were evaluated.
    from training.observers.progress import eval_table

    table = eval_table(10, evaluation, 1.0)  # What the log shows says which rows are the average's.
    assert "the unprefixed rows are the averaged weights'" in table and "raw_*: the trained weights'" in table
    assert "averaged" not in eval_table(10, {"loss": 1.0, "accuracy": 0.5}, 1.0)  # Without EMA: no such line.


@pytest.mark.parametrize("value", [1.0, 1.5, -0.1, True, "0.9"])
def test_ema_decay_outside_zero_one_is_refused(small_config, value):
    with pytest.raises(ConfigError, match=r"EMA_DECAY=.* must be a number in \[0, 1\).*EMA_DECAY=0.999"):
        small_config(ema_decay=value)


def test_ema_decay_zero_or_none_is_off_and_a_bad_value_is_exit_2_before_training(small_config):
    assert small_config(ema_decay=0).ema_decay is None and small_config().ema_decay is None
    assert small_config(ema_decay=0.999).ema_decay == 0.999
    result = run_train_py(DIGITS, "--gin_param=EMA_DECAY=1.0", "--model_dir=/nonexistent/never")
    assert result.returncode == 2 and "error: EMA_DECAY=1.0 must be a number in [0, 1)" in result.stderr


@pytest.mark.slow
def test_switching_ema_on_or_off_on_resume_is_exit_2_and_off_leaves_the_checkpoint_unchanged(tmp_path, data_dir):
    off, on = str(tmp_path / "off"), str(tmp_path / "on")
    assert run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=5", f"--model_dir={off}").returncode == 0
    assert not [key for key in checkpoint_values(off) if "ema" in key]  # The default checkpoint: no averages.
    assert "EMA_DECAY" not in json.load(open(f"{off}/run_identity.json"))
    switched = run_train_py(*COMMON, EMA, "--gin_param=TRAIN_STEPS=10", f"--model_dir={off}")
    assert switched.returncode == 2, switched.stderr
    assert "a run with EMA off; this run has EMA_DECAY=0.9. EMA cannot be switched on or off" in switched.stderr

    assert run_train_py(*COMMON, EMA, "--gin_param=TRAIN_STEPS=5", f"--model_dir={on}").returncode == 0
    assert any(key.startswith("ema/averages/") for key in checkpoint_values(on))
    switched = run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=10", f"--model_dir={on}")
    assert switched.returncode == 2
    assert 'EMA_DECAY=0.9; this run has EMA off.' in switched.stderr and 'EMA_DECAY=0.9"' in switched.stderr
    # Another decay is not a switch: it resumes.
    resumed = run_train_py(*COMMON, "--gin_param=EMA_DECAY=0.8", "--gin_param=TRAIN_STEPS=10", f"--model_dir={on}")
    assert resumed.returncode == 0, resumed.stderr


@pytest.mark.slow
def test_resume_is_bit_exact_with_the_averages(tmp_path, data_dir):
    """2 replicas: 10 steps, then a resume to 20, equals 20 straight, bit for bit, averages and update count too."""
    interrupted, straight = str(tmp_path / "interrupted"), str(tmp_path / "straight")
    mirrored = ["--gin_param=STRATEGY='mirrored'", "--gin_param=VIRTUAL_DEVICES=2"]
    for model_dir, steps in ((interrupted, 10), (interrupted, 20), (straight, 20)):
        result = run_train_py(*COMMON, *mirrored, EMA, f"--gin_param=TRAIN_STEPS={steps}", f"--model_dir={model_dir}")
        assert result.returncode == 0, result.stderr
    resumed, uninterrupted = checkpoint_values(interrupted), checkpoint_values(straight)
    averages = [key for key in resumed if key.startswith("ema/averages/")]
    assert resumed.keys() == uninterrupted.keys() and len(averages) == 6  # 3 Dense layers: kernels and biases.
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)
    assert resumed["ema/updates/.ATTRIBUTES/VARIABLE_VALUE"] == 20


def _served_logits(export_dir: str, features: np.ndarray, tmp_path) -> np.ndarray:
    """The logits export_dir's serving_default gives for `features`, in a fresh process (no repository imports)."""
    np.save(tmp_path / "features.npy", features)
    script = ("import sys, numpy as np, tensorflow as tf\n"
              "serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
              "np.save(sys.argv[3], serve(images=tf.constant(np.load(sys.argv[2])))['logits'].numpy())\n")
    result = subprocess.run([sys.executable, "-c", script, export_dir, str(tmp_path / "features.npy"),
                             str(tmp_path / "logits.npy")], capture_output=True, text=True, timeout=120,
                            cwd=str(tmp_path), env={key: value for key, value in os.environ.items()
                                                    if key != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr[-2000:]
    return np.load(tmp_path / "logits.npy")


@pytest.mark.slow
def test_export_and_export_best_serve_the_ema_weights(tmp_path, small_config):
    """export/<step>/ and export/best/ give the EMA model's logits (to 1e-5), not the trained weights' (negative
    control: those differ by far more)."""
    from training.controller import Controller
    from training.run_directory.layout import RunDirectory
    from training.run_directory.record import RunRecord

    trainer = _trainer(small_config, 1, ema_decay=0.9, train_steps=20, eval_every=20, steps_per_loop=10,
                       best_metric="eval/accuracy")
    run = str(tmp_path / "run")
    controller = Controller(trainer, RunRecord(trainer, RunDirectory(run)))
    controller.record.restore()
    controller.train_and_evaluate()
    assert json.load(open(f"{run}/best/best.json"))["step"] == 20  # The best is the last: the same weights.
    features = np.random.RandomState(0).randint(0, 17, size=(20, 8, 8, 1)).astype(np.uint8)
    raw = trainer.model(trainer.task.preprocess(features), training=False).numpy()
    with trainer.serving_weights():
        averaged = trainer.model(trainer.task.preprocess(features), training=False).numpy()
    assert np.max(np.abs(averaged - raw)) > 1e-2
    for export in ("20", "best"):
        served = _served_logits(f"{run}/export/{export}", features, tmp_path)
        np.testing.assert_allclose(served, averaged, rtol=1e-5, atol=1e-5, err_msg=export)
        assert np.max(np.abs(served - raw)) > 1e-2, export


def test_the_replica_invariance_check_compares_the_averages(data_dir):
    """training/replica_invariance.py with EMA on compares ema/<weight> tensors too (the full 1, 2, 4-replica float64
    check at 1e-9 is the 'mlp-adam-ema' case of tests/test_replica_invariance.py); a planted difference in one
    average fails it (negative control)."""
    from training import replica_invariance

    runs, probe = replica_invariance.measure(shipped_config("configs/experiments/digits_mlp.gin", "EMA_DECAY=0.9"),
                                             [1, 2], steps=5)
    names = [name for name, _ in runs[1].weights]
    assert sum(name.startswith("ema/") for name in names) == 6
    assert replica_invariance.report(runs, probe)[0]
    index = next(index for index, (name, _) in enumerate(runs[1].weights) if name.startswith("ema/"))
    value = runs[1].weights[index][1]
    value += 1e-6 * np.max(np.abs(value))  # In place: the 2-replica run's average, off by 1e-6.
    replica_invariance.compare(runs)  # Names the reference run's tensor (layer names differ between builds).
    assert not replica_invariance.report(runs, probe)[0] and runs[1].worst_tensor == runs[0].weights[index][0]
