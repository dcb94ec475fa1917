"""Dropout keyed by example (models/layers.py): a mask belongs to an example, not to a replica or a batch.

The float64 replica-invariance tests train with dropout on (tests/test_replica_invariance.py); here: the mask's
properties, that replicas draw different masks (each its own examples') in one strategy.run, a real multi-replica
run through train.py (Keras' Dropout crashed there), and an exact resume with dropout on.
"""

import numpy as np
import pytest
import tensorflow as tf

from common.keyed_random import keys_from_positions
from helpers import checkpoint_values, run_train_py
from models.layers import StatelessDropout, example_keys

RATE = 0.3


def _masks(positions, *, seed=0, salt=0, units=(256,)):
    """The dropout mask (1 kept, 0 dropped) of each example at `positions`."""
    layer = StatelessDropout(RATE, salt=salt)
    inputs = tf.ones([len(positions), *units])
    with example_keys(keys_from_positions(seed, tf.constant(positions, tf.int64))):
        outputs = layer(inputs, training=True)
    return (outputs.numpy() != 0).astype(np.int8)


def test_an_examples_mask_does_not_depend_on_its_batch():
    whole = _masks(list(range(64)))
    for begin, end in ((0, 16), (16, 48), (60, 64)):
        np.testing.assert_array_equal(_masks(list(range(begin, end))), whole[begin:end])
    np.testing.assert_array_equal(_masks([40, 3]), whole[[40, 3]])


def test_masks_differ_by_example_layer_and_seed_and_keep_the_rate():
    masks = _masks(list(range(512)), units=(8, 8, 16))
    flat = masks.reshape(len(masks), -1)
    assert abs(flat.mean() - (1 - RATE)) < 0.01  # 524,288 draws: 6 standard deviations is 0.004.
    assert len({row.tobytes() for row in flat}) == len(flat)  # Every example its own mask.
    # Units are independent: neighbouring units agree as often as chance says (0.7^2 + 0.3^2 = 0.58).
    assert abs((flat[:, 1:] == flat[:, :-1]).mean() - 0.58) < 0.01
    for other in (_masks(list(range(512)), units=(8, 8, 16), salt=1), _masks(list(range(512)), units=(8, 8, 16),
                                                                             seed=1)):
        agreement = (other.reshape(len(other), -1) == flat).mean()
        assert abs(agreement - 0.58) < 0.01  # Another layer or seed: an independent mask.


def test_inference_and_rate_zero_are_the_identity():
    inputs = tf.random.normal([4, 10])
    np.testing.assert_array_equal(StatelessDropout(RATE, salt=0)(inputs, training=False), inputs)
    with example_keys(keys_from_positions(0, tf.range(4, dtype=tf.int64))):
        np.testing.assert_array_equal(StatelessDropout(0.0, salt=0)(inputs, training=True), inputs)
        kept = StatelessDropout(RATE, salt=0)(inputs, training=True).numpy()
    nonzero = kept != 0
    np.testing.assert_allclose(kept[nonzero], inputs.numpy()[nonzero] / (1 - RATE), rtol=1e-6)  # Scaled up.


def test_each_replica_draws_its_own_examples_masks():
    """Two replicas in one strategy.run (each traced in its own thread): each replica's masks are those of its own
    examples' positions, so the replicas' masks differ and together equal the one-replica masks."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    layer = StatelessDropout(RATE, salt=0)
    positions = tf.data.Dataset.range(64).batch(32)  # Replica r gets positions [32 r, 32 r + 32).

    @tf.function
    def run(batch):
        def replica(positions):
            with example_keys(keys_from_positions(0, positions)):
                return layer(tf.ones([32, 128]), training=True)

        return strategy.experimental_local_results(strategy.run(replica, args=(batch,)))

    batch = next(iter(strategy.experimental_distribute_dataset(positions.unbatch().batch(64))))
    first, second = [(output.numpy() != 0).astype(np.int8) for output in run(batch)]
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(np.concatenate([first, second]), _masks(list(range(64)), units=(128,)))


COMMON = ["--gin_file=configs/experiments/digits_mlp.gin", "--gin_param=mlp.dropout_rate=0.3",
          "--gin_param=STRATEGY='mirrored'", "--gin_param=VIRTUAL_DEVICES=2", "--gin_param=STEPS_PER_LOOP=10",
          "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=0",
          # Constant: a cosine schedule's length is TRAIN_STEPS, which the resumed run raises.
          "--gin_param=experiment.lr_schedule='constant'"]


@pytest.mark.slow
def test_train_py_with_dropout_on_two_replicas_resumes_exactly(tmp_path, data_dir):
    """Keras' Dropout crashed here (its int64 seed state was averaged across replicas); now the run trains, and a
    run stopped at step 20 and resumed ends bit for bit where an uninterrupted one does."""
    interrupted, straight = str(tmp_path / "interrupted"), str(tmp_path / "straight")
    full = run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=40", f"--model_dir={straight}")
    assert full.returncode == 0, full.stderr
    assert float(full.stdout.split("'eval': {'loss': ")[1].split(",")[0]) < 1.0  # It learned, with dropout.
    first = run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=20", f"--model_dir={interrupted}")
    assert first.returncode == 0, first.stderr
    second = run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=40", f"--model_dir={interrupted}")
    assert second.returncode == 0, second.stderr
    assert "at step 20" in second.stdout
    resumed, uninterrupted = checkpoint_values(interrupted), checkpoint_values(straight)
    assert resumed.keys() == uninterrupted.keys()
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)
