"""The on-device loop: many steps per host call, the same code on CPU, GPU and TPU.

`tf.range` inside one `tf.function` keeps the loop on the device; the step count is a tensor, so a shorter last
loop does not retrace. Nothing here logs, saves or evaluates: the host loop (training/controller.py) does that
between calls.
"""

import tensorflow as tf


def make_train_loop(strategy: tf.distribute.Strategy, replica_step):
    """Returns loop(iterator, num_steps) -> mean over the steps of the global loss (a float32 scalar).

    `replica_step` returns each replica's share of the global loss; their SUM is the global loss.
    """

    @tf.function
    def train_loop(iterator, num_steps):
        total = tf.constant(0.0, tf.float32)
        for _ in tf.range(num_steps):
            per_replica_loss = strategy.run(replica_step, args=(next(iterator),))
            total += tf.cast(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None), tf.float32)
        return total / tf.cast(num_steps, tf.float32)

    return train_loop


def make_eval_loop(strategy: tf.distribute.Strategy, replica_step):
    """Returns loop(iterator, num_steps) running `replica_step` on `num_steps` global batches (for its metrics)."""

    @tf.function
    def eval_loop(iterator, num_steps):
        for _ in tf.range(num_steps):
            strategy.run(replica_step, args=(next(iterator),))

    return eval_loop
