"""mixed_bfloat16: bfloat16 compute, float32 variables, logits and loss; finite and in agreement across replicas.

bfloat16 rounding (~1e-2 over a few steps) is as large as the factor-of-R bug, so the contract checks mixed
precision for finiteness and loss agreement only; the exact math is checked in float32 (test_replica_invariance.py).
"""

import math

import pytest

from tpu_utils.strategy import make_strategy
from training.errors import ConfigError
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


def test_mixed_float16_is_refused_with_advice(small_config):
    with pytest.raises(ConfigError, match="Use 'mixed_bfloat16'"):
        Trainer(small_config(precision="mixed_float16"), make_strategy("default"))
