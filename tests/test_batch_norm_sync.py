"""models/batch_norm_sync.py: synchronized BatchNormalization with the same values and gradients as Keras's own, at 2
replicas on virtual CPUs in float64, without TensorFlow's graph walk through the other replicas while tracing.

Negative controls: a cross-replica sum whose gradient stays local differs (so the comparison can fail), and Keras's
own moments walk the other replica's graph (so the walk check can fail)."""

import numpy as np
import pytest


def _step_results(moments):
    """Outputs, moving statistics and gradients of a 2-replica float64 step through a model with two synchronized
    BatchNormalization layers, with Keras's synchronized moments replaced by `moments`; and the largest number of
    ops one of TensorFlow's custom-gradient variable searches walked while tracing it."""
    import keras
    import tensorflow as tf
    from keras.src.backend.tensorflow import nn as keras_nn
    from tensorflow.python.ops import custom_gradient

    from tpu_utils.strategy import make_strategy
    from training.build_scope import seeded_build

    walked = [0]
    search = custom_gradient._get_dependent_variables

    def counting(input_ops, output_ops):
        from tensorflow.python.ops import op_selector

        ops = op_selector.get_backward_walk_ops(output_ops, stop_at_ts=input_ops, inclusive=False,
                                                only_differentiable=True)
        walked[0] = max(walked[0], len(ops))
        return search(input_ops, output_ops)

    original = keras_nn._compute_moments_sync
    keras_nn._compute_moments_sync, custom_gradient._get_dependent_variables = moments, counting
    try:
        strategy = make_strategy("mirrored", virtual_devices=2)
        with seeded_build("float64", 0), strategy.scope():
            inputs = keras.Input((6,), dtype="float64")
            hidden = keras.layers.BatchNormalization(synchronized=True)(keras.layers.Dense(5)(inputs))
            outputs = keras.layers.BatchNormalization(synchronized=True)(keras.layers.Dense(3)(hidden))
            model = keras.Model(inputs, outputs)
        data = np.random.RandomState(1).normal(size=(8, 6)) * np.arange(1, 9)[:, None]  # Replicas differ.
        batches = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(data).batch(8)))

        @tf.function
        def step(batch):
            def replica(x):
                with tf.GradientTape() as tape:
                    y = model(x, training=True)
                    loss = tf.reduce_sum(tf.square(y) * tf.range(1, 4, dtype=tf.float64))
                return y, tape.gradient(loss, model.trainable_variables)

            return strategy.run(replica, args=(batch,))

        outputs, gradients = step(next(batches))
        local = strategy.experimental_local_results
        return ([value.numpy() for value in local(outputs)]
                + [value.numpy() for gradient in gradients for value in local(gradient)]
                + [variable.numpy() for variable in model.non_trainable_variables]), walked[0]
    finally:
        keras_nn._compute_moments_sync, custom_gradient._get_dependent_variables = original, search


@pytest.fixture(scope="module")
def keras_own():
    """Keras's own moments' results (installed or not: an earlier test's Trainer may have installed the other)."""
    from models import batch_norm_sync

    own = batch_norm_sync.keras_own_moments()
    assert own is not batch_norm_sync.synchronized_moments
    return _step_results(own)


def test_the_same_values_and_gradients_as_keras_and_no_walk_through_the_other_replica(keras_own):
    from models import batch_norm_sync

    expected, walked_by_keras = keras_own
    results, walked = _step_results(batch_norm_sync.synchronized_moments)
    assert len(results) == len(expected) == 2 + 2 * 8 + 4
    for index, (result, value) in enumerate(zip(results, expected, strict=True)):
        assert np.array_equal(result, value), (index, result, value)  # Bit for bit.
    assert walked <= 10 < 100 <= walked_by_keras, (walked, walked_by_keras)  # Measured: 4 and 295.


def test_negative_control_a_sum_with_a_local_gradient_gives_other_gradients(keras_own, monkeypatch):
    import tensorflow as tf

    from models import batch_norm_sync

    def local_gradient(value):
        total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.stop_gradient(value))
        return value + tf.stop_gradient(total - value)

    monkeypatch.setattr(batch_norm_sync, "cross_replica_sum", local_gradient)
    expected, _ = keras_own
    results, _ = _step_results(batch_norm_sync.synchronized_moments)
    differing = [index for index, (result, value) in enumerate(zip(results, expected, strict=True))
                 if not np.allclose(result, value, rtol=1e-9, atol=0)]
    assert any(2 <= index < 18 for index in differing), differing  # Gradients differ.


def test_install_makes_keras_use_it_and_is_idempotent():
    from keras.src.backend.tensorflow import nn as keras_nn

    from models import batch_norm_sync

    batch_norm_sync.install()
    batch_norm_sync.install()
    assert keras_nn._compute_moments_sync is batch_norm_sync.synchronized_moments
