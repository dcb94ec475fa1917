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
                    replica_local_variables=(), *, outputs=("loss",), accumulate_dtype=tf.float32):
    """Returns loop(source, num_steps) -> {name: mean over the steps of the global value} for `outputs`.

    `source` is a distributed iterator of per-replica batches, or an object whose `replica_batch(step)` gives, in
    replica context, this replica's batch of global step `step` (data/device_split.py: no input pipeline at all).

    `replica_step` returns a dict with (at least) the keys in `outputs`: each replica's share of a global value
    (e.g. the loss); their SUM over replicas is the global value. They are accumulated in `accumulate_dtype`
    (float64 for float64 runs, so the check of exact math is not rounded to float32).
    `step_counter` (int64) counts the global batches consumed, skipped loss-scaling steps included.
    `replica_local_variables` (e.g. `model.non_trainable_variables`) are averaged over replicas after the steps;
    only floating-point ones: integer state such as a random-seed counter is never averaged.
    """
    variables = [getattr(variable, "value", variable) for variable in replica_local_variables
                 if tf.as_dtype(variable.dtype).is_floating]

    @tf.function
    def train_loop(source, num_steps):
        totals = {name: tf.constant(0.0, accumulate_dtype) for name in outputs}
        first_step = step_counter.read_value()
        for index in tf.range(num_steps):
            per_replica = run_on_next_batch(strategy, replica_step, source, first_step + tf.cast(index, tf.int64))
            totals = {name: totals[name] + tf.cast(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica[name],
                                                                   axis=None), accumulate_dtype)
                      for name in outputs}
        average_replica_copies(strategy, variables)
        step_counter.assign_add(tf.cast(num_steps, tf.int64))
        return {name: total / tf.cast(num_steps, accumulate_dtype) for name, total in totals.items()}

    return train_loop


def run_on_next_batch(strategy: tf.distribute.Strategy, replica_fn, source, step: tf.Tensor):
    """strategy.run(replica_fn, ...) on each replica's batch of global step `step` (int64) from `source`: the next
    element of a distributed iterator, or `source.replica_batch(step)` drawn on the device (data/device_split.py)."""
    if hasattr(source, "replica_batch"):
        return strategy.run(lambda step: replica_fn(source.replica_batch(step)), args=(step,))
    return strategy.run(replica_fn, args=(next(source),))


def average_replica_copies(strategy: tf.distribute.Strategy, variables) -> None:
    """Sets every replica's copy of each variable to the mean of the copies, on every worker.

    Runs in replica context with an all-reduce, so the copies on other workers (MultiWorkerMirroredStrategy) and
    other TPU hosts take part; call it inside a tf.function. Variables are read with tf.identity: under
    MultiWorkerMirroredStrategy, all_reduce of `tf.convert_to_tensor(variable)` fails ("destinations can not be
    empty").
    """
    if strategy.num_replicas_in_sync == 1 or not variables:
        return

    def average():
        context = tf.distribute.get_replica_context()
        for variable in variables:
            variable.assign(context.all_reduce(tf.distribute.ReduceOp.MEAN, tf.identity(variable)))

    strategy.run(average)


def replica_disagreement(strategy: tf.distribute.Strategy, variables) -> float:
    """How far the replicas' copies of `variables` are apart: the worst, over variables, of
    sum over replicas of max|copy - mean of copies| / max|mean of copies|. 0 when all copies are equal (synchronous
    training keeps them so), on one machine or many; measured with SUM all-reduces only (what every backend has).
    """
    variables = [getattr(variable, "value", variable) for variable in variables]
    if strategy.num_replicas_in_sync == 1 or not variables:
        return 0.0

    @tf.function
    def measure():
        def per_replica():
            # Two all-reduces for all the variables together, each a list: ten ops and two all-reduces per variable
            # took 11.5 s to build for MobileNetV3Small's 208 variables on 2 replicas, at the end of every run; this
            # 3.4 s. The means of all the variables are alive at once, as the step's all-reduced gradients are.
            context = tf.distribute.get_replica_context()
            replicas = tf.cast(context.num_replicas_in_sync, tf.float32)
            values = [tf.cast(tf.identity(variable), tf.float32) for variable in variables]
            means = [total / replicas for total in context.all_reduce(tf.distribute.ReduceOp.SUM, values)]
            deviations = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.stack(
                [tf.reduce_max(tf.abs(value - mean)) for value, mean in zip(values, means, strict=True)]))
            scales = tf.stack([tf.maximum(tf.reduce_max(tf.abs(mean)), 1e-30) for mean in means])
            return tf.maximum(tf.reduce_max(deviations / scales), 0.0)  # An empty variable's maximum is -inf.

        return strategy.experimental_local_results(strategy.run(per_replica))[0]

    return float(measure())


def make_any_worker(strategy: tf.distribute.Strategy):
    """Returns any_worker(flag: bool) -> bool: whether `flag` is true in any process of the job.

    For host-side decisions every worker must take together, such as stopping after a SIGTERM that reached only
    some of them: a worker that stopped alone would leave the others blocked in their next collective. One scalar
    all-reduce per call, compiled once.
    """

    @tf.function
    def count(flag):
        def per_replica():
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(flag))

        return strategy.experimental_local_results(strategy.run(per_replica))[0]

    return lambda flag: bool(count(tf.constant(1.0 if flag else 0.0)) > 0)


def make_eval_loop(strategy: tf.distribute.Strategy, replica_step):
    """Returns loop(iterator, num_steps) running `replica_step` on `num_steps` global batches (for its metrics)."""

    @tf.function
    def eval_loop(iterator, num_steps):
        for _ in tf.range(num_steps):
            strategy.run(replica_step, args=(next(iterator),))

    return eval_loop
