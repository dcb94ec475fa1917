"""The per-replica training and evaluation steps: pure math, no I/O, no Python side effects (they run on TPUs).

Loss scaling, in one place:
- the loss function gives per-example losses (never a mean);
- each replica divides their sum by the GLOBAL batch size (`average_over_global_batch`), because the replicas'
  gradients are then summed: the sum over R replicas of (local sum / global batch) is the global mean. Dividing by
  the per-replica batch instead trains R times too fast and raises no error;
- regularization losses are divided by the replica count (`tf.nn.scale_regularization_loss`) for the same reason;
- the gradients are summed across replicas once, explicitly, then clipped by their global norm (clipping before the
  sum, as Keras' clipnorm does, clips each replica's share and is wrong), then applied. Keras' own implicit
  all-reduce in `apply_gradients` is switched off (`disable_implicit_gradient_sum`) so the wire carries them once;
- metrics are updated per replica and aggregate correctly on read: they are not rescaled.

mixed_float16 (dynamic loss scaling with keras.optimizers.LossScaleOptimizer): the gradients of the scaled loss are
summed across replicas before the optimizer checks them for inf/NaN, so an overflow on any replica makes the sum
non-finite on every replica and all of them skip the step together. (Keras alone checks each replica's own
gradients, and applies an overflow that happened on another replica.) Clipping the scaled sum at
clip_global_norm * scale is clipping the unscaled gradients at clip_global_norm.
"""

import keras
import tensorflow as tf


def average_over_global_batch(per_example_loss: tf.Tensor, global_batch_size: int) -> tf.Tensor:
    """Sum of this replica's per-example losses / GLOBAL batch size (see the module docstring for why)."""
    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)


def sum_across_replicas(gradients: list) -> list:
    """All-reduce (SUM) of the gradients over replicas; None gradients (unused variables) stay None."""
    present = [gradient for gradient in gradients if gradient is not None]
    summed = iter(tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, present)
                  if present else [])
    return [None if gradient is None else next(summed) for gradient in gradients]


def disable_implicit_gradient_sum(optimizer: keras.optimizers.Optimizer) -> None:
    """Stops Keras' `apply_gradients` from all-reducing again gradients that the step has already summed.

    Keras 3's TensorFlow optimizer sums gradients across replicas inside `apply_gradients` (in
    `_all_reduce_sum_gradients`). The step sums them itself, so it can clip the sum; summing twice would make the
    update R times too large (the replica-invariance tests fail loudly if this override ever stops taking effect).
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer  # The one whose apply_gradients does the update (and the all-reduce).
    if not hasattr(type(optimizer), "_all_reduce_sum_gradients"):
        raise RuntimeError(f"Keras {keras.__version__}: {type(optimizer).__name__} has no _all_reduce_sum_gradients; "
                           "the pinned Keras version is required (requirements-common.txt).")
    object.__setattr__(optimizer, "_all_reduce_sum_gradients", _already_summed)


def _already_summed(grads_and_vars):
    return list(grads_and_vars)


def check_per_example(per_example_loss: tf.Tensor, labels: tf.Tensor) -> None:
    """Rejects (at trace time) a loss function that averaged its output: it must return one loss per example."""
    if per_example_loss.shape.rank != 1 or per_example_loss.shape[0] != labels.shape[0]:
        raise ValueError(f"The loss function returned shape {per_example_loss.shape}; it must return per-example "
                         f"losses of shape [{labels.shape[0]}] (reduction=None). Do not average: the training step "
                         "divides by the global batch size, which a per-replica mean gets wrong by the replica count.")


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, loss_fn, *, global_batch_size: int,
                    clip_global_norm: float | None, accuracy: keras.metrics.Metric):
    """Returns train_step((images, labels)) -> this replica's share of the global loss, for `strategy.run`."""
    disable_implicit_gradient_sum(optimizer)
    loss_scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def train_step(batch):
        images, labels = batch
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example_loss = loss_fn(labels, logits)
            check_per_example(per_example_loss, labels)
            loss = average_over_global_batch(per_example_loss, global_batch_size)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled_loss = optimizer.scale_loss(loss) if loss_scaling else loss
        variables = model.trainable_variables
        gradients = sum_across_replicas(tape.gradient(scaled_loss, variables))
        if clip_global_norm:
            clip_norm = clip_global_norm * optimizer.dynamic_scale if loss_scaling else clip_global_norm
            gradients, _ = tf.clip_by_global_norm(gradients, clip_norm)
        optimizer.apply_gradients(zip(gradients, variables))  # With loss scaling: unscales, skips if non-finite.
        accuracy.update_state(labels, logits)
        return loss

    return train_step


def make_eval_step(model: keras.Model, loss_fn, *, loss: keras.metrics.Metric, accuracy: keras.metrics.Metric):
    """Returns eval_step((images, labels, mask)); padding (mask 0) counts in no metric."""

    def eval_step(batch):
        images, labels, mask = batch
        logits = model(images, training=False)
        loss.update_state(loss_fn(labels, logits), sample_weight=mask)
        accuracy.update_state(labels, logits, sample_weight=mask)

    return eval_step
