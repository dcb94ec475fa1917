"""Every replica holds the same copy of every model variable after each loop, BatchNormalization statistics included.

Keras 3 gives BatchNormalization's moving statistics aggregation NONE under MirroredStrategy, and each replica
updates its own copy from its own batch; tpu_utils/loop.py averages the copies after every loop. The negative
control turns that averaging off and shows the copies drift apart.
"""

import numpy as np
import pytest

from tpu_utils import loop
from tpu_utils.strategy import make_strategy
from training.trainer import Trainer


def _worst_copy_difference(trainer: Trainer) -> float:
    worst = 0.0
    for variable in trainer.model.weights:
        copies = [copy.numpy() for copy in trainer.strategy.experimental_local_results(variable.value)]
        worst = max([worst] + [float(np.max(np.abs(copies[0] - copy))) for copy in copies[1:]])
    return worst


def test_replica_copies_are_equal_after_a_loop(small_config):
    trainer = Trainer(small_config(model="cnn", strategy="mirrored", virtual_devices=3),
                      make_strategy("mirrored", virtual_devices=3))
    trainer.train(trainer.train_iterator(), 5)
    assert _worst_copy_difference(trainer) == 0.0
    # The end-of-run check (training/controller.py) measures the same with all-reduces; the mean over 3 copies may
    # round by an ulp, hence 1e-6 rather than 0.
    assert loop.replica_disagreement(trainer.strategy, trainer.model.variables) < 1e-6


def test_negative_control_without_averaging_the_copies_drift(small_config, monkeypatch):
    monkeypatch.setattr(loop, "average_replica_copies", lambda strategy, variables: None)
    trainer = Trainer(small_config(model="cnn", strategy="mirrored", virtual_devices=3),
                      make_strategy("mirrored", virtual_devices=3))
    trainer.train(trainer.train_iterator(), 5)
    assert _worst_copy_difference(trainer) > 1e-4
    # ... and the check sees it: its two all-reduces over all the variables give its formula as numpy computes it
    # from the copies (float32 sums: 1e-5 relative).
    measured = loop.replica_disagreement(trainer.strategy, trainer.model.variables)
    assert measured > 1e-5 and np.isclose(measured, _disagreement_in_numpy(trainer), rtol=1e-5, atol=0), measured


def _disagreement_in_numpy(trainer: Trainer) -> float:
    """loop.replica_disagreement's definition, per variable from its copies: the sum over replicas of
    max|copy - mean| / max|mean|, the worst over variables."""
    worst = 0.0
    for variable in trainer.model.variables:
        copies = np.stack([copy.numpy() for copy in trainer.strategy.experimental_local_results(variable.value)])
        mean = copies.mean(axis=0)
        deviation = sum(float(np.max(np.abs(copy - mean))) for copy in copies)
        worst = max(worst, deviation / max(float(np.max(np.abs(mean))), 1e-30))
    return worst


@pytest.mark.parametrize("replicas", [2, 4])
def test_moving_statistics_are_the_mean_of_the_replica_statistics(small_config, replicas):
    """Averaging copies at the loop end equals averaging the batch statistics at every step (the EMA is linear).

    With synchronized BatchNormalization every replica already sees the global statistics, so its moving mean must
    equal the one of a 1-replica run (tolerance 1e-5, relative to the largest value).
    """
    import gin

    gin.bind_parameter("cnn.synchronized_batch_norm", True)
    reference = Trainer(small_config(model="cnn"), make_strategy("default"))
    initial = reference.model.get_weights()
    reference.train(reference.train_iterator(), 5)
    trainer = Trainer(small_config(model="cnn", strategy="mirrored", virtual_devices=replicas),
                      make_strategy("mirrored", virtual_devices=replicas))
    trainer.model.set_weights(initial)
    trainer.train(trainer.train_iterator(), 5)
    pairs = zip(reference.model.non_trainable_weights, trainer.model.non_trainable_weights, strict=True)
    for expected, actual in pairs:
        scale = np.max(np.abs(expected.numpy()))
        assert np.max(np.abs(expected.numpy() - actual.numpy())) <= 1e-5 * scale, expected.path
