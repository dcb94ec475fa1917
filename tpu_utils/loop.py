"""The on-device loop: many steps per host call, the same code on CPU, GPU and TPU.

`tf.range` inside one `tf.function` keeps the loop on the device; the step count is a tensor, so a shorter last
loop does not retrace. Nothing here logs, saves or evaluates: the host loop (training/controller.py) does that
between calls.

Replica-local state: Keras 3 creates non-trainable variables such as BatchNormalization's moving mean and variance
as mirrored variables with aggregation NONE, and each replica updates its own copy from its own batch, so the copies
drift apart (measured: 2e-2 after 5 steps at 3 replicas) and evaluation would use a different statistic on each
replica. At the end of every loop the train loop sets each copy to the mean over replicas. The moving averages are
linear in their updates, so this equals the moving average of the replica-averaged batch statistics.
"""

import tensorflow as tf


def make_train_loop(strategy: tf.distribute.Strategy, replica_step, step_counter: tf.Variable,
                    replica_local_variables=()):
    """Returns loop(iterator, num_steps) -> mean over the steps of the global loss (a float32 scalar).

    `replica_step` returns each replica's share of the global loss; their SUM is the global loss.
    `step_counter` (int64) counts the global batches consumed, skipped loss-scaling steps included.
    `replica_local_variables` (e.g. `model.non_trainable_variables`) are averaged over replicas after the steps.
    """
    variables = [getattr(variable, "value", variable) for variable in replica_local_variables]

    @tf.function
    def train_loop(iterator, num_steps):
        total = tf.constant(0.0, tf.float32)
        for _ in tf.range(num_steps):
            per_replica_loss = strategy.run(replica_step, args=(next(iterator),))
            total += tf.cast(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None), tf.float32)
        average_replica_copies(strategy, variables)
        step_counter.assign_add(tf.cast(num_steps, tf.int64))
        return total / tf.cast(num_steps, tf.float32)

    return train_loop


def average_replica_copies(strategy: tf.distribute.Strategy, variables) -> None:
    """Sets every replica's copy of each variable to the mean of the copies (cross-replica context)."""
    if strategy.num_replicas_in_sync == 1:
        return
    for variable in variables:
        copies = strategy.experimental_local_results(variable)
        if len(copies) > 1:
            variable.assign(tf.add_n([tf.convert_to_tensor(copy) for copy in copies]) / len(copies))


def make_eval_loop(strategy: tf.distribute.Strategy, replica_step):
    """Returns loop(iterator, num_steps) running `replica_step` on `num_steps` global batches (for its metrics)."""

    @tf.function
    def eval_loop(iterator, num_steps):
        for _ in tf.range(num_steps):
            strategy.run(replica_step, args=(next(iterator),))

    return eval_loop
