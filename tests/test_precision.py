"""Mixed precision. mixed_bfloat16: bfloat16 compute, float32 variables, logits and loss; finite and in agreement
across replicas. mixed_float16: dynamic loss scaling where an overflow on any replica skips the step on all.
float64: every model end to end (what the replica-invariance check runs in).

bfloat16 rounding (~1e-2 over a few steps) is as large as the factor-of-R bug, so mixed precision is checked for
finiteness and loss agreement only; the exact math is checked in float64 (test_replica_invariance.py).
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from tpu_utils.strategy import make_strategy
from training.learning import step
from training.trainer import Trainer


def test_mixed_bfloat16_is_finite_and_agrees_across_replica_counts(small_config):
    losses, initial = [], None
    for replicas in (1, 2):
        config = small_config(model="cnn", precision="mixed_bfloat16", strategy="mirrored", virtual_devices=replicas)
        trainer = Trainer(config, make_strategy("mirrored", virtual_devices=replicas))
        initial = initial or trainer.model.get_weights()
        trainer.model.set_weights(initial)
        assert trainer.model.layers[1].compute_dtype == "bfloat16"
        assert all(variable.dtype == "float32" for variable in trainer.model.weights)
        assert trainer.model.output.dtype == "float32"  # Logits, loss and metrics stay float32.
        metrics = trainer.train(trainer.train_iterator(), 10)
        evaluation = trainer.evaluate()
        assert math.isfinite(metrics["loss"]) and math.isfinite(evaluation["loss"])
        losses.append(metrics["loss"])
    assert losses[1] == pytest.approx(losses[0], rel=1e-2)


def _poison_first_step(monkeypatch, *, target_replica: int, holder: dict, sum_gradients: bool = True):
    """Makes `target_replica`'s gradients infinite while global_step == 0 (an injected float16 overflow)."""
    original = step.sum_across_replicas

    def poisoned(gradients):
        context = tf.distribute.get_replica_context()
        poison = tf.logical_and(tf.equal(context.replica_id_in_sync_group, target_replica),
                                tf.equal(holder["trainer"].global_step, 0))
        gradients = [tf.where(poison, tf.fill(tf.shape(g), np.inf), g) for g in gradients]
        return original(gradients) if sum_gradients else gradients

    monkeypatch.setattr(step, "sum_across_replicas", poisoned)


def _float16_trainer(small_config, replicas, initial=None):
    config = small_config(model="mlp", precision="mixed_float16", strategy="mirrored", virtual_devices=replicas,
                          clip_global_norm=1.0)
    trainer = Trainer(config, make_strategy("mirrored", virtual_devices=replicas))
    if initial is not None:
        trainer.model.set_weights(initial)
    return trainer


def _copies(trainer):
    return [[copy.numpy() for copy in trainer.strategy.experimental_local_results(variable.value)]
            for variable in trainer.model.trainable_weights]


@pytest.mark.parametrize("replicas, target", [(1, 0), (2, 1)])
def test_float16_overflow_on_one_replica_skips_the_step_on_all(small_config, monkeypatch, replicas, target):
    """Overflow on replica 1 of 2 (and the same overflow in a 1-replica run): the step is skipped everywhere."""
    holder = {}
    _poison_first_step(monkeypatch, target_replica=target, holder=holder)
    reference = _float16_trainer(small_config, 1)  # Only for identical initial weights.
    initial = reference.model.get_weights()
    trainer = holder["trainer"] = _float16_trainer(small_config, replicas, initial)
    scale_before = float(trainer.optimizer.dynamic_scale.numpy())
    iterator = trainer.train_iterator()
    trainer.train(iterator, 1)  # The poisoned step.
    for expected, copies in zip(initial, _copies(trainer), strict=True):
        for copy in copies:  # Every replica skipped: weights untouched, bit for bit.
            np.testing.assert_array_equal(copy, expected)
    assert float(trainer.optimizer.dynamic_scale.numpy()) == scale_before / 2
    assert int(trainer.optimizer.iterations.numpy()) == 0 and trainer.step == 1
    metrics = trainer.train(iterator, 4)  # Training goes on normally.
    assert math.isfinite(metrics["loss"])
    assert all(np.all(np.isfinite(copy)) for copies in _copies(trainer) for copy in copies)
    assert int(trainer.optimizer.iterations.numpy()) == 4


def test_float16_two_replicas_agree_with_one_replica_after_a_skipped_overflow(small_config, monkeypatch):
    """Same overflow in both runs, then 4 normal steps: finite, and the 2-replica loss agrees with the 1-replica one.

    As docs/correctness.md says, mixed precision is checked for finiteness and loss agreement only: float16 rounding
    differs by replica count (2.3e-4 on weights overall, and several % on near-zero tensors such as young biases), so
    weights are compared for finiteness only. An overflow applied on one replica gives NaN (the negative control).
    """
    holder, weights, losses = {}, [], []
    initial = None
    for replicas, target in ((1, 0), (2, 1)):
        _poison_first_step(monkeypatch, target_replica=target, holder=holder)
        trainer = holder["trainer"] = _float16_trainer(small_config, replicas, initial)
        initial = initial or trainer.model.get_weights()
        iterator = trainer.train_iterator()
        trainer.train(iterator, 1)
        losses.append(trainer.train(iterator, 4)["loss"])
        weights.append(trainer.model.get_weights())
    assert losses[1] == pytest.approx(losses[0], rel=1e-2)
    assert all(np.all(np.isfinite(tensor)) for tensor in weights[0] + weights[1])


def test_negative_control_keras_alone_applies_another_replicas_overflow(small_config, monkeypatch):
    """Without the step's own all-reduce, Keras' LossScaleOptimizer checks replica 0 only: weights become NaN."""
    holder = {}
    _poison_first_step(monkeypatch, target_replica=1, holder=holder, sum_gradients=False)
    monkeypatch.setattr(step, "disable_implicit_gradient_sum", lambda optimizer: None)
    trainer = holder["trainer"] = _float16_trainer(small_config, 2)
    trainer.train(trainer.train_iterator(), 1)
    assert not all(np.all(np.isfinite(copy)) for copies in _copies(trainer) for copy in copies)


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet"])
def test_every_model_keeps_logits_float32_under_mixed_bfloat16(name, small_config):
    """What the TPU configs rely on: bfloat16 compute, float32 weights and logits, and no loss scaling."""
    import keras

    from models.registry import MODELS

    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        model = MODELS[name]((32, 32, 3), 10)
        compute = {layer.compute_dtype for layer in model.layers if layer.weights and layer.name != "logits"}
        assert compute == {"bfloat16"}, compute
        assert model.output.dtype == "float32" and all(weight.dtype == "float32" for weight in model.weights)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    trainer = Trainer(small_config(model=name, precision="mixed_bfloat16"), make_strategy("default"))
    assert not isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet"])
def test_every_model_trains_in_float64_end_to_end(name, small_config):
    """PRECISION='float64' (what the replica-invariance check runs in): weights, logits, per-example losses and the
    reported loss are all float64, with dropout on."""
    import gin
    import tensorflow as tf

    from training.learning.losses import get_loss

    gin.bind_parameter(f"{name}.dropout_rate", 0.2)
    if name == "resnet":
        gin.bind_parameter("resnet.depth", 8)
    trainer = Trainer(small_config(model=name, precision="float64"), make_strategy("default"))
    assert all(weight.dtype == "float64" for weight in trainer.model.weights)
    assert trainer.model.output.dtype == "float64"
    features, labels, _ = next(iter(trainer.train_input_fn()(tf.distribute.InputContext())))
    assert get_loss("softmax_cross_entropy")(labels, trainer.model(features)).dtype == tf.float64
    metrics = trainer.train(trainer.train_iterator(), 5)
    assert np.isfinite(metrics["loss"]) and 0 < metrics["loss"] < 10
    # Not rounded to float32 on the way out: float64 has bits below float32's 24-bit mantissa.
    assert metrics["loss"] != float(np.float32(metrics["loss"]))


def test_building_a_trainer_leaves_no_process_wide_state_behind(small_config):
    """A Trainer sets the dtype policy and the seeds for its build only (training/build_scope.py): the process's
    policy and random generators are as before, while the same SEED still gives the same initial weights and another
    SEED other weights (the control that shows the comparison can fail)."""
    import random

    import keras

    random.seed(123)
    python_state = random.getstate()
    first = Trainer(small_config(precision="float64", seed=0), make_strategy("default"))
    assert keras.config.dtype_policy().name == "float32" and random.getstate() == python_state
    assert first.model.weights[0].dtype == "float64"  # The build itself ran in float64.
    again = Trainer(small_config(precision="float64", seed=0), make_strategy("default"))
    other = Trainer(small_config(precision="float64", seed=1), make_strategy("default"))
    assert all(np.array_equal(a, b) for a, b in zip(first.model.get_weights(), again.model.get_weights(), strict=True))
    assert not np.array_equal(first.model.get_weights()[0], other.model.get_weights()[0])
