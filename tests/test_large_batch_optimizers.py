"""LARS against a NumPy reference, weight-decay exclusion by path for AdamW, SGD and LAMB, the 'step' and
'polynomial' schedules and their refusals. (Replica invariance of each: tests/test_replica_invariance.py.)

Float64 throughout: the reference and the optimizer compute the same expressions, so they agree to ~1e-16; the
tolerance 1e-12 (relative) leaves room for summation order, and every wrong variant checked here is off by > 1e-4.
"""

import json
import os
import shlex

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from common.errors import ConfigError
from helpers import REPO_ROOT, run_train_py
from training.learning import optimizers, schedules
from training.learning.lars import LARS

TOLERANCE = 1e-12


def _model():
    """Dense (kernel, bias) -> BatchNormalization (gamma, beta) -> Dense: the variable kinds LARS treats apart,
    none of them zero (a zero variable has nothing to decay and no trust ratio)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,), dtype="float64")
    x = keras.layers.Dense(4, dtype="float64", bias_initializer="random_normal", name="dense")(inputs)
    x = keras.layers.BatchNormalization(dtype="float64", beta_initializer="ones", name="batch_normalization")(x)
    return keras.Model(inputs, keras.layers.Dense(2, dtype="float64", bias_initializer="random_normal",
                                                  name="logits")(x))


def _gradients(model, seed: int) -> list[np.ndarray]:
    generator = np.random.default_rng(seed)
    return [generator.normal(size=variable.shape) for variable in model.trainable_variables]


def _lars_reference(weights, gradient_steps, paths, *, learning_rate, momentum, weight_decay, trust_coefficient,
                    excluded):
    """You et al. 2017's LARS in Model Garden's classic-momentum form, in NumPy (see training/learning/lars.py)."""
    weights = [weight.copy() for weight in weights]
    velocities = [np.zeros_like(weight) for weight in weights]
    for gradients in gradient_steps:
        for index, (path, gradient) in enumerate(zip(paths, gradients, strict=True)):
            rate = learning_rate
            if not excluded(path):
                gradient = gradient + weight_decay * weights[index]
                weight_norm, gradient_norm = np.linalg.norm(weights[index]), np.linalg.norm(gradient)
                rate *= trust_coefficient * weight_norm / gradient_norm if weight_norm and gradient_norm else 1.0
            velocities[index] = momentum * velocities[index] + rate * gradient
            weights[index] = weights[index] - velocities[index]
    return weights


def _apply(optimizer, model, gradient_steps, *, jit_compile=False):
    optimizer.build(model.trainable_variables)
    apply = tf.function(lambda gradients: optimizer.apply_gradients(zip(gradients, model.trainable_variables,
                                                                        strict=True)), jit_compile=jit_compile)
    for gradients in gradient_steps:
        apply([tf.constant(gradient) for gradient in gradients])
    return [variable.numpy() for variable in model.trainable_variables]


def _worst(expected, actual) -> float:
    return max(float(np.max(np.abs(a - b)) / np.max(np.abs(a))) for a, b in zip(expected, actual, strict=True))


SETTINGS = {"learning_rate": 2.0, "momentum": 0.9, "weight_decay": 0.01, "trust_coefficient": 0.001}


@pytest.mark.parametrize("jit_compile", [False, True], ids=["eager-graph", "xla"])
def test_lars_matches_the_numpy_reference_over_two_updates_with_the_default_exclusion(jit_compile):
    model = _model()
    paths = [variable.path for variable in model.trainable_variables]
    assert paths == ["dense/kernel", "dense/bias", "batch_normalization/gamma", "batch_normalization/beta",
                     "logits/kernel", "logits/bias"]  # Keras 3's paths, which the default patterns match.
    initial = [variable.numpy() for variable in model.trainable_variables]
    steps = [_gradients(model, 1), _gradients(model, 2)]
    optimizer = LARS(**SETTINGS)  # Default exclusion: biases and BatchNormalization.
    actual = _apply(optimizer, model, steps, jit_compile=jit_compile)
    assert [optimizer.treatment(path) for path in paths] == [(True, True), (False, False), (False, False),
                                                              (False, False), (True, True), (False, False)]
    expected = _lars_reference(initial, steps, paths, **SETTINGS,
                               excluded=lambda path: "bias" in path or "batch_normalization" in path)
    assert _worst(expected, actual) <= TOLERANCE
    # Negative controls: the reference without the exclusion, and without the trust ratio, are far from it.
    no_exclusion = _lars_reference(initial, steps, paths, **SETTINGS, excluded=lambda path: False)
    assert _worst(no_exclusion, actual) > 1e-4
    plain_momentum = _lars_reference(initial, steps, paths, **SETTINGS, excluded=lambda path: True)
    assert _worst(plain_momentum, actual) > 1e-4


def test_lars_without_exclusion_adapts_every_variable():
    """The exclusion is a setting: with none, the biases and BatchNormalization get the trust ratio and decay too,
    and the NumPy reference without exclusion matches."""
    model = _model()
    paths = [variable.path for variable in model.trainable_variables]
    initial = [variable.numpy() for variable in model.trainable_variables]
    steps = [_gradients(model, 1), _gradients(model, 2)]
    actual = _apply(LARS(**SETTINGS, exclude_from_weight_decay=()), model, steps)
    assert _worst(_lars_reference(initial, steps, paths, **SETTINGS, excluded=lambda path: False),
                  actual) <= TOLERANCE


def _decay_only_update(name: str, *params: str):
    """Each variable's relative change after one update with zero gradients through make_optimizer: the weight
    decay alone (Adam's, LAMB's and SGD's steps of a zero gradient are 0)."""
    gin.parse_config([f"{name}.weight_decay = 0.1", *params])
    model = _model()
    before = {variable.path: variable.numpy() for variable in model.trainable_variables}
    optimizer = optimizers.make_optimizer(name, learning_rate=0.5, schedule="constant", train_steps=10,
                                          variables=model.trainable_variables)
    _apply(optimizer, model, [[np.zeros(variable.shape) for variable in model.trainable_variables]])
    return {variable.path: float(np.max(np.abs(variable.numpy() - before[variable.path])
                                        / np.maximum(np.abs(before[variable.path]), 1e-30)))
            for variable in model.trainable_variables}


@pytest.mark.parametrize("name", ["adamw", "sgd", "lamb"])
def test_weight_decay_exclusion_by_path_pattern_removes_the_decay_of_the_matched_variables_only(name):
    """Excluded (bias, BatchNormalization): unchanged. Included (kernels): w * (1 - learning_rate * weight_decay)
    = a relative change of 0.05 (to 1e-6: Keras holds weight_decay in float32, 0.1 is 0.10000000149). Negative
    control: with no exclusion the biases and gamma decay by the same 0.05."""
    excluded = _decay_only_update(name, f"{name}.exclude_from_weight_decay = ['bias', 'batch_normalization']")
    gin.clear_config()
    everything = _decay_only_update(name, f"{name}.exclude_from_weight_decay = []")
    for path, change in excluded.items():
        if "kernel" in path:
            assert change == pytest.approx(0.05, rel=1e-6), path
        else:
            assert change == 0.0, path
            assert everything[path] == pytest.approx(0.05, rel=1e-6), path


def test_keras_own_name_patterns_would_miss_a_layer_name():
    """Why the patterns are resolved by path: Keras 3 matches `exclude_from_weight_decay(var_names=...)` against
    `variable.name`, which has no layer in it ('gamma', not 'batch_normalization/gamma')."""
    model = _model()
    gamma = next(variable for variable in model.trainable_variables if variable.path.endswith("gamma"))
    assert gamma.name == "gamma" and gamma.path == "batch_normalization/gamma"


@pytest.mark.parametrize("setting, message", [
    ("adamw.exclude_from_weight_decay = 'bias'", "adamw.exclude_from_weight_decay='bias' must be a list"),
    ("lars.exclude_from_weight_decay = ['(bias']", "'(bias' is not a regular expression"),
    ("lars.weight_decay = -1.0", "lars.weight_decay=-1.0 must be a number >= 0"),
    ("lars.momentum = 1.0", "lars.momentum=1.0 must be a number in [0, 1)"),
])
def test_bad_optimizer_settings_are_config_errors_naming_the_value(setting, message):
    gin.parse_config([setting])
    name = setting.split(".")[0]
    with pytest.raises(ConfigError) as error:
        optimizers.make_optimizer(name, learning_rate=0.1, schedule="constant", train_steps=10)
    assert message in str(error.value) and "--gin_param" in str(error.value)


def _rates(schedule, steps) -> list[float]:
    return [float(schedule(tf.constant(step, tf.int64))) for step in steps]


def test_step_schedule_warms_up_then_steps_down_at_fractions_or_steps():
    schedule = schedules.step(1.6, 900, boundaries=(0.333, 0.667, 0.889), warmup_steps=45)
    assert _rates(schedule, [0, 15, 45, 299, 300, 600, 800, 899]) == pytest.approx(
        [0.0, 1.6 / 3, 1.6, 1.6, 0.16, 0.016, 0.0016, 0.0016], rel=1e-6)
    by_steps = schedules.step(1.0, 100, boundaries=(10, 50), multipliers=(1.0, 0.5, 0.2))
    assert _rates(by_steps, [0, 9, 10, 49, 50, 99]) == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.2, 0.2], rel=1e-6)
    compiled = tf.function(lambda step: by_steps(step), jit_compile=True)
    assert float(compiled(tf.constant(60, tf.int64))) == pytest.approx(0.2, rel=1e-6)


def test_polynomial_schedule_warms_up_then_decays_with_power_2_to_its_end():
    schedule = schedules.polynomial(10.0, 110, warmup_steps=10, power=2.0, end_learning_rate=0.0001)
    expected = [0.0, 5.0, 10.0, (10.0 - 0.0001) * 0.5 ** 2 + 0.0001, 0.0001, 0.0001]
    assert _rates(schedule, [0, 5, 10, 60, 110, 200]) == pytest.approx(expected, rel=1e-6)
    compiled = tf.function(lambda step: schedule(step), jit_compile=True)
    assert float(compiled(tf.constant(60, tf.int64))) == pytest.approx(expected[3], rel=1e-6)


@pytest.mark.parametrize("make, message", [
    (lambda: schedules.step(0.1, 100, boundaries=(50, 20)), "must be strictly increasing"),
    (lambda: schedules.step(0.1, 100, boundaries=(50, 100)), "before TRAIN_STEPS=100: move the boundaries inside"),
    (lambda: schedules.step(0.1, 100, boundaries=(0.5, 1.5)), "must lie in (0, 1)"),
    (lambda: schedules.step(0.1, 100, boundaries=(0.5, 80)), "mixes fractions (floats) and steps (integers)"),
    (lambda: schedules.step(0.1, 100, boundaries=(10, 50), warmup_steps=20), "after step.warmup_steps=20"),
    (lambda: schedules.step(0.1, 100, boundaries=(10, 50), multipliers=(1.0, 0.1)), "must be 3 numbers >= 0"),
    (lambda: schedules.polynomial(0.1, 100, warmup_steps=100), "lower polynomial.warmup_steps or raise TRAIN_STEPS"),
    (lambda: schedules.polynomial(0.1, 100, end_learning_rate=0.5), "must be a number in [0, LEARNING_RATE=0.1]"),
    (lambda: schedules.cosine(0.1, 100, warmup_steps=150), "lower cosine.warmup_steps or raise TRAIN_STEPS"),
])
def test_bad_schedule_settings_are_config_errors_naming_the_value_and_the_fix(make, message):
    with pytest.raises(ConfigError) as error:
        make()
    assert message in str(error.value)


def test_good_boundaries_pass_the_checks_the_bad_ones_fail():
    """Negative control of the refusals above: the same settings made valid build a schedule."""
    schedules.step(0.1, 100, boundaries=(20, 50), warmup_steps=10)
    schedules.polynomial(0.1, 100, warmup_steps=99, end_learning_rate=0.1)
    schedules.cosine(0.1, 100, warmup_steps=99)


def _documented_lars_command() -> list[str]:
    """docs/configuration.md's LARS command, continuation lines joined, as argv without the interpreter."""
    text = open(os.path.join(REPO_ROOT, "docs", "configuration.md")).read()
    start = text.index("    .venv/bin/python train.py --model_dir=runs/lars_digits")
    lines = []
    for line in text[start:].splitlines():
        lines.append(line.strip().rstrip("\\"))
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(lines))[1:]


@pytest.mark.slow
def test_the_documented_lars_command_trains_the_digits_cnn(tmp_path, data_dir):
    """docs/configuration.md's command, as shown (1,000 steps, ~30 s): LARS on the polynomial decay reaches what
    the page states. Measured 99.7% test accuracy; asserted >= 98.5% (a margin for other CPUs' rounding; a LARS
    that does not train, e.g. a trust ratio of 0, stays near 10%)."""
    argv = _documented_lars_command()
    assert argv[:2] == ["train.py", "--model_dir=runs/lars_digits"]
    result = run_train_py(*argv[2:], f"--model_dir={tmp_path / 'run'}", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = json.load(open(tmp_path / "run" / "metrics.json"))
    print(f"LARS digits CNN: eval accuracy {metrics['eval']['accuracy']:.4f} at step {metrics['step']}")
    assert metrics["step"] == 1000 and metrics["eval"]["accuracy"] >= 0.985


@pytest.mark.slow
def test_the_invariance_check_catches_a_double_gradient_sum_under_lars(data_dir, monkeypatch):
    """Negative control for the LARS case: LARS' trust ratio divides out the gradient's scale (lr * eta * |w| / |g|
    * g), so a doubled gradient sum would hide in its kernels; the excluded biases and BatchNormalization (plain
    momentum SGD) and the weight-decay term still show it, and the check fails far outside 1e-9."""
    from test_replica_invariance import CASES, PLANTED_BUGS

    from helpers import shipped_config
    from training import replica_invariance

    config_file, params, _ = CASES["cnn-lars-polynomial"]
    PLANTED_BUGS["double_gradient_sum"](monkeypatch)
    runs, probe = replica_invariance.measure(shipped_config(config_file, *params), [1, 2], steps=25)
    passed, table = replica_invariance.report(runs, probe)
    print(table)
    assert not passed and runs[1].worst_difference > 1e4 * replica_invariance.TOLERANCE, table


def test_a_lars_run_resumed_from_its_checkpoint_continues_bit_for_bit(tmp_path, small_config):
    """LARS' momentum slots are checkpointed and its treatment of each variable is rebuilt the same: 20 steps, a
    restore into a new Trainer, 20 more equals 40 straight (exactly, on CPU), on the polynomial decay with warm-up.
    Negative control: a resume that lost the momentum slots (zeroed) ends elsewhere."""
    from tpu_utils.strategy import make_strategy
    from training.controller import Controller
    from training.run_directory.layout import RunDirectory
    from training.run_directory.record import RunRecord
    from training.trainer import Trainer

    gin.parse_config(["polynomial.warmup_steps = 5"])
    config = {"optimizer": "lars", "lr_schedule": "polynomial", "learning_rate": 10.0}

    def run(model_dir, *, first_steps=0, zero_slots=False):
        """40 steps in all (TRAIN_STEPS=40 throughout: the schedule's curve is the same); first_steps > 0: that
        many, a checkpoint, then the rest in a new Trainer restored from it."""
        def trainer_and_controller():
            trainer = Trainer(small_config(train_steps=40, **config), make_strategy("default"))
            return trainer, Controller(trainer, RunRecord(trainer, RunDirectory(str(model_dir))))

        trainer, controller = trainer_and_controller()
        controller.record.restore()
        if first_steps:
            trainer.train(trainer.train_iterator(), first_steps)
            controller.record.save(first_steps)  # The checkpoint a run interrupted after `first_steps` leaves.
            trainer, controller = trainer_and_controller()
            controller.record.restore()
            assert trainer.step == first_steps
            if zero_slots:
                for variable in trainer.optimizer.variables:
                    if "momentum" in variable.path:
                        variable.assign(np.zeros(variable.shape, variable.dtype))
        trainer.train(trainer.train_iterator(), 40 - trainer.step)
        return [variable.numpy() for variable in trainer.model.weights]

    straight = run(tmp_path / "straight")
    resumed = run(tmp_path / "resumed", first_steps=20)
    for a, b in zip(resumed, straight, strict=True):
        np.testing.assert_array_equal(a, b)
    lost = run(tmp_path / "lost", first_steps=20, zero_slots=True)
    assert _worst(straight, lost) > 1e-4
