"""Gradient accumulation (ACCUMULATE_STEPS=k): one optimizer step from k micro-batches, for batches that do not fit.

Each replica splits its batch of GLOBAL_BATCH_SIZE / replicas examples into k consecutive micro-batches (in stream
order: micro-batch j holds the replica's examples j*m .. (j+1)*m - 1, m = GLOBAL_BATCH_SIZE / (k * replicas)) and
runs them one after another in a `tf.while_loop` (parallel_iterations=1, so only one micro-batch's activations are
alive at a time: that is the memory saved). Each micro-batch's per-example losses are divided by the GLOBAL batch
(training/learning/step.py's `average_over_global_batch`), never by the micro-batch, so the sum of the k gradients is
exactly the gradient of the full batch at k=1. Then the step does what the k=1 step does: add the regularization
gradient (once per optimizer step, at the step's weights: the same term as at k=1, not k times), sum across replicas
once, clip the sum, apply. Dropout masks are keyed by each example's stream position, which travels with it into its
micro-batch, so they are the same at any k. Metrics are updated on every micro-batch: over the whole global batch.

What differs from k=1 in exact math: nothing, for models without batch statistics. BatchNormalization normalises each
micro-batch by its own statistics (GLOBAL_BATCH_SIZE / k examples, synchronized or not) and updates its moving
averages k times per step: a BN model at k > 1 trains like one at the micro-batch size, not bit-for-bit like k=1
(docs/correctness.md). Activity regularizers (losses a layer adds in call()) are per micro-batch and not supported:
the step refuses them when traced.

k=1 never comes here: the Trainer builds step.make_train_step, so the default run is unchanged bit for bit.
"""

import keras
import tensorflow as tf

from common.errors import ConfigError
from common.settings import MAX_STEPS, how_to_set, nearest_multiple, require_int
from training.learning import step


def split_into_micro_batches(batch, accumulate_steps: int):
    """Every tensor of `batch` reshaped from [b, ...] to [k, b / k, ...]: micro-batch j is rows j*b/k .. (j+1)*b/k - 1
    (consecutive, in order). The trainer checked that b divides by k."""

    def split(tensor):
        static = tensor.shape.as_list()
        micro = None if static[0] is None else static[0] // accumulate_steps
        reshaped = tf.reshape(tensor, tf.concat([[accumulate_steps, -1], tf.shape(tensor)[1:]], axis=0))
        reshaped.set_shape([accumulate_steps, micro, *static[1:]])
        return reshaped

    return tf.nest.map_structure(split, batch)


def make_accumulating_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, loss_fn, *,
                                 global_batch_size: int, accumulate_steps: int, clip_global_norm: float | None,
                                 metrics: list, seed: int, variables: list | None = None, mixing=None):
    """Returns train_step((features, labels, positions)) -> {'loss', 'regularization'} like step.make_train_step's,
    from `accumulate_steps` micro-batches of the replica's batch (see the module docstring); `variables` as there."""
    step.disable_implicit_gradient_sum(optimizer)
    loss_scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    variables = model.trainable_variables if variables is None else list(variables)

    def scaled(loss):
        return optimizer.scale_loss(loss) if loss_scaling else loss

    def train_step(batch):
        micro_batches = split_into_micro_batches(batch, accumulate_steps)
        weight_losses = len(model.losses)  # Regularizers of weights: computed from the variables, no call needed.
        with tf.GradientTape() as tape:  # Once per optimizer step, at the step's weights.
            regularization = step.regularization_share(model.losses) if weight_losses else None
            scaled_regularization = scaled(regularization) if weight_losses else None
        gradient_sums = (tape.gradient(scaled_regularization, variables) if weight_losses
                         else [None] * len(variables))
        has_gradient = [False] * len(variables)  # Set while the body is traced: which variables the data loss reaches.

        def body(index, loss_sum, sums):
            micro_batch = tf.nest.map_structure(lambda tensor: tf.gather(tensor, index), micro_batches)
            _, labels, _ = micro_batch
            with tf.GradientTape() as micro_tape:
                logits, loss, _ = step.forward(model, loss_fn, micro_batch, global_batch_size=global_batch_size,
                                               seed=seed, mixing=mixing)
                scaled_loss = scaled(loss)
            if len(model.losses) != weight_losses:
                # ValueError: AutoGraph keeps its type (see step.check_per_example).
                raise ValueError(f"ACCUMULATE_STEPS={accumulate_steps}: the model adds losses in call() (activity "
                                 "regularizers), which accumulation would count per micro-batch; use weight "
                                 "regularizers, or ACCUMULATE_STEPS=1.")
            gradients = micro_tape.gradient(scaled_loss, variables)
            for metric in metrics:  # Per micro-batch: over the whole global batch in the end.
                metric.update(labels, logits)
            new_sums = []
            for position, (total, gradient) in enumerate(zip(sums, gradients, strict=True)):
                has_gradient[position] = has_gradient[position] or gradient is not None
                new_sums.append(total if gradient is None else total + tf.convert_to_tensor(gradient))
            return index + 1, loss_sum + loss, new_sums

        zeros = [tf.zeros(variable.shape, variable.dtype) for variable in variables]
        loss_dtype = variables[0].dtype if variables else tf.float32
        _, loss, data_sums = tf.while_loop(
            lambda index, *_: index < accumulate_steps, body,
            (tf.constant(0), tf.zeros((), tf.float64 if loss_dtype == tf.float64 else tf.float32), zeros),
            parallel_iterations=1)  # One micro-batch at a time: the point of accumulating.
        step.apply_summed(optimizer, _combined(data_sums, gradient_sums, has_gradient), variables, clip_global_norm)
        if regularization is None:
            regularization = tf.zeros((), loss.dtype)
        return {"loss": loss, "regularization": regularization}

    return train_step


def _combined(data_sums: list, regularization_gradients: list, has_gradient: list) -> list:
    """Per variable: the data gradient summed over micro-batches plus the regularization gradient; None where neither
    reaches the variable, as at k=1."""
    gradients = []
    for data, regularizer, reached in zip(data_sums, regularization_gradients, has_gradient, strict=True):
        if regularizer is not None:
            regularizer = tf.convert_to_tensor(regularizer)
        gradients.append((data if regularizer is None else regularizer + data) if reached else regularizer)
    return gradients


def check_settings(config) -> None:
    """ACCUMULATE_STEPS: micro-batches of equal size, at least one example each, counted in int32 on the device."""
    require_int("accumulate_steps", config.accumulate_steps, minimum=1, example=1, maximum=MAX_STEPS,
                why="2**31 - 1: the micro-batch loop counts in int32 on the device")
    batch, steps = config.global_batch_size, config.accumulate_steps
    if steps > batch:  # Suggest a divisor, not a GLOBAL_BATCH_SIZE of k.
        divisor = next((k for k in range(2, batch + 1) if batch % k == 0), 1)
        raise ConfigError(f"ACCUMULATE_STEPS={steps} is more than GLOBAL_BATCH_SIZE={batch}, the examples of one "
                          f"step: each of its micro-batches needs at least one. Use a divisor of {batch} (each "
                          "micro-batch holds GLOBAL_BATCH_SIZE / ACCUMULATE_STEPS examples), e.g. "
                          f"{how_to_set('accumulate_steps', divisor)}.")
    if batch % steps:
        raise ConfigError(f"GLOBAL_BATCH_SIZE={batch} does not divide by ACCUMULATE_STEPS={steps}: every micro-batch "
                          f"must have the same size. Use a multiple of {steps}, e.g. "
                          f"{how_to_set('global_batch_size', nearest_multiple(batch, steps))}, or another "
                          "ACCUMULATE_STEPS.")
