"""Synchronized BatchNormalization's cross-replica sums, traced in linear time under MirroredStrategy.

Why: Keras's `BatchNormalization(synchronized=True)` sums its batch statistics over the replicas with
`ReplicaContext.all_reduce`. Where the strategy reduces through `merge_call` (MirroredStrategy on CPUs, and on GPUs
without XLA), TensorFlow wraps each such sum in `tf.custom_gradient`, which, while tracing, walks the graph backwards
from the sum's result to find the variables used on the way: through every replica's part of the graph up to that
layer (the result depends on all of them), with a list-membership test per op. Each synchronized layer, forward and
backward, pays for the whole graph so far: tracing grows with the square of the depth and of the replica count. A
2-replica training step of MobileNetV3Small (34 such layers) took 106 s to trace here against 12 s for 1 replica.

`install()` replaces Keras's synchronized moments (keras/src/backend/tensorflow/nn.py `_compute_moments_sync`,
keras pinned in requirements-common.txt) with the same arithmetic whose sums go through `cross_replica_sum`: the same
all-reduce on inputs cut from the graph (`tf.stop_gradient`, where the walk stops at once) and the same gradient as
TensorFlow's (the gradient of a sum over replicas is the sum of the upstream gradients over replicas). Same values,
same gradients (tests/test_batch_norm_sync.py compares both bit for bit); the step above traces in 27 s. TPUStrategy
and MultiWorkerMirroredStrategy reduce without merge_call (they never walked the other replicas) and run the same
sums through this function (on a TPU: unverified, none here).
"""

_REPLACED = {}  # Keras's own _compute_moments_sync, once install() has replaced it (tests compare with it).


def keras_own_moments():
    """Keras's own synchronized moments, installed or not."""
    from keras.src.backend.tensorflow import nn as keras_nn

    return _REPLACED.get("keras", keras_nn._compute_moments_sync)


def cross_replica_sum(value):
    """The sum of `value` over the replicas in sync (in a replica context), differentiable: its gradient is the sum
    of the upstream gradients over the replicas, as TensorFlow's `ReplicaContext.all_reduce`'s."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()

    @tf.custom_gradient
    def summed(local):
        def gradient(upstream):
            return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.stop_gradient(upstream))

        return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.stop_gradient(local)), gradient

    return summed(value)


def synchronized_moments(x, axes, keepdims):
    """Keras's `_compute_moments_sync` (keras 3.15.1) with its three all-reduces made by `cross_replica_sum`."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import nn as keras_nn

    if not tf.distribute.get_replica_context():
        return keras_nn._compute_moments(x, axes, keepdims)
    local_sum = tf.reduce_sum(x, axis=axes, keepdims=True)
    local_squared_sum = tf.reduce_sum(tf.square(x), axis=axes, keepdims=True)
    local_count = tf.reduce_sum(tf.ones_like(x, name="count"), axis=axes, keepdims=True)
    # Three all-reduces, not one batched, as Keras does: NCCL needs the same launch order on every replica.
    y_sum = cross_replica_sum(local_sum)
    y_squared_sum = cross_replica_sum(local_squared_sum)
    count_sum = cross_replica_sum(local_count)
    mean = tf.math.divide_no_nan(y_sum, count_sum)
    y_squared_mean = tf.math.divide_no_nan(y_squared_sum, count_sum)
    variance = tf.maximum(y_squared_mean - tf.square(mean), 0.0)  # E(x^2) - E(x)^2
    if not keepdims:
        mean = tf.squeeze(mean, axes)
        variance = tf.squeeze(variance, axes)
    return mean, variance


def install() -> None:
    """Makes Keras's synchronized BatchNormalization use `synchronized_moments` (idempotent). Called before a model
    is traced (training/trainer.py); a Keras without the function it replaces is an error, not a silent slow path."""
    from keras.src.backend.tensorflow import nn as keras_nn

    if getattr(keras_nn, "_compute_moments_sync", None) is synchronized_moments:
        return
    if not callable(getattr(keras_nn, "_compute_moments_sync", None)):
        raise RuntimeError("keras/src/backend/tensorflow/nn.py has no _compute_moments_sync: this Keras is not the "
                           "one requirements-common.txt pins; see models/batch_norm_sync.py.")
    _REPLACED["keras"] = keras_nn._compute_moments_sync
    keras_nn._compute_moments_sync = synchronized_moments
