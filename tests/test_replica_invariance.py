"""Weights after a few steps are the same at 1, 2, 4 and 8 replicas (same global batch), for every shipped model.

Measured as the contract says (max|a - b| / max|a| per tensor, worst tensor, tolerance 1e-5, float32, dropout off,
synchronized BatchNormalization), with a kernel regularizer and gradient clipping on, with SGD and with Adam.
Negative controls show the check fails for the bugs it exists to catch.
"""

import dataclasses

import gin
import pytest
import tensorflow as tf

from models.registry import MODELS
from helpers import run_module
from training import replica_invariance, step

REPLICAS = [1, 2, 4, 8]
STEPS = 3


def _config(small_config, model, optimizer):
    gin.bind_parameter(f"{model}.kernel_l2", 1e-3)  # model.losses is non-empty: regularization scaling is exercised.
    # Adam's update g / (sqrt(v) + epsilon) turns float32 rounding noise in near-zero gradients (conv kernels feeding
    # BatchNormalization cancel to ~1e-10) into ~1e-4 weight differences with the default epsilon 1e-7: numerics,
    # not a bug. epsilon 1e-3 damps that, and makes Adam more, not less, sensitive to a factor-of-R gradient error.
    gin.bind_parameter("adam.epsilon", 1e-3)
    # The smallest ResNet (one block per stage, 9 BatchNormalization layers): the same block code as ResNet-20/50.
    # Tracing synchronized BN at 8 replicas walks the graph once per BN all-reduce gradient, which at depth 20
    # takes many minutes on CPU.
    gin.bind_parameter("resnet.depth", 8)
    # A clip norm below the gradient norm of the first steps, so clipping is active (checked below).
    return small_config(model=model, optimizer=optimizer, learning_rate=0.05, clip_global_norm=0.5)


# Every model with SGD and Adam, except ResNet with Adam: its 8-replica trace alone takes ~2 minutes on 2 cores, and
# the Adam path is the same code as for the other models.
MODEL_OPTIMIZERS = [(model, optimizer) for model in sorted(MODELS) for optimizer in ("sgd", "adam")
                    if (model, optimizer) != ("resnet", "adam")]


@pytest.mark.slow
@pytest.mark.parametrize("model, optimizer", MODEL_OPTIMIZERS)
def test_weights_match_across_replica_counts(small_config, model, optimizer):
    runs = replica_invariance.measure(_config(small_config, model, optimizer), REPLICAS, steps=STEPS)
    passed, table = replica_invariance.report(runs)
    print(table)
    assert passed, table
    assert [run.replicas for run in runs] == REPLICAS
    # The reported (SUM-reduced) training loss is the same at every replica count.
    for run in runs[1:]:
        assert run.loss == pytest.approx(runs[0].loss, rel=1e-5)


def test_clipping_is_active_in_the_invariance_config(small_config):
    """Clipping must bind in the configuration above, or the clip-after-sum path would go untested."""
    clipped = replica_invariance.measure(_config(small_config, "mlp", "sgd"), [1], steps=1)[0]
    unclipped_config = dataclasses.replace(_config(small_config, "mlp", "sgd"), clip_global_norm=None)
    unclipped = replica_invariance.measure(unclipped_config, [1], steps=1)[0]
    difference = max(replica_invariance.relative_difference(a, b)
                     for (_, a), (_, b) in zip(clipped.weights, unclipped.weights))
    assert difference > 1e-4


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_negative_control_per_replica_mean_loss_is_detected(small_config, monkeypatch, optimizer):
    """A loss averaged over the per-replica batch (the classic bug) fails the same check, with SGD and with Adam."""
    monkeypatch.setattr(step, "average_over_global_batch", lambda per_example, global_batch: tf.reduce_mean(per_example))
    runs = replica_invariance.measure(_config(small_config, "mlp", optimizer), [1, 4], steps=STEPS)
    passed, table = replica_invariance.report(runs)
    print(table)
    assert not passed
    # Far outside the tolerance (clipping bounds the step, so the weights move less than R times; the loss shows R).
    assert runs[1].worst_difference > 10 * replica_invariance.TOLERANCE
    assert runs[1].loss == pytest.approx(4 * runs[0].loss, rel=0.2)


def test_negative_control_gradients_summed_twice_is_detected(small_config, monkeypatch):
    """If Keras' implicit all-reduce were left on beside the step's own, updates would be R times too large."""
    monkeypatch.setattr(step, "disable_implicit_gradient_sum", lambda optimizer: None)
    runs = replica_invariance.measure(small_config(model="mlp", learning_rate=0.05), [1, 2], steps=STEPS)
    passed, table = replica_invariance.report(runs)
    print(table)
    assert not passed


def test_a_loss_that_returns_a_mean_is_rejected(small_config, monkeypatch):
    """A user loss that averages (shape []) instead of returning per-example losses fails at trace time."""
    from training import losses

    monkeypatch.setitem(losses.LOSSES, "mean_loss", lambda labels, logits: tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)))
    with pytest.raises(ValueError, match="per-example losses"):
        replica_invariance.measure(small_config(model="mlp", loss="mean_loss"), [1], steps=1)


def test_cli_passes_on_the_default_config(data_dir):
    result = run_module("training.replica_invariance", "--replicas=1,2", "--steps=2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
