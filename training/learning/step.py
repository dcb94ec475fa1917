"""The per-replica training and evaluation steps: pure math, no I/O, no Python side effects (they run on TPUs).

Loss scaling, in one place:
- the loss function gives per-example losses (never a mean);
- each replica divides their sum by the GLOBAL batch size (`average_over_global_batch`), because the replicas'
  gradients are then summed: the sum over R replicas of (local sum / global batch) is the global mean. Dividing by
  the per-replica batch instead trains R times too fast and raises no error;
- regularization losses are divided by the replica count (`tf.nn.scale_regularization_loss`) for the same reason;
  the step reports the data loss and the regularization term apart, so the logged training loss means what the
  evaluation loss means;
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

from common.keyed_random import keys_from_positions
from models import layers


def average_over_global_batch(per_example_loss: tf.Tensor, global_batch_size: int) -> tf.Tensor:
    """Sum of this replica's per-example losses / GLOBAL batch size (see the module docstring for why)."""
    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)


def regularization_share(regularization_losses: list) -> tf.Tensor:
    """This replica's share of the model's regularization losses: their sum / replica count (summed over replicas
    with the gradients, it counts once)."""
    return tf.nn.scale_regularization_loss(tf.add_n(regularization_losses))


def sum_across_replicas(gradients: list) -> list:
    """All-reduce (SUM) of the gradients over replicas; None gradients (unused variables) stay None."""
    present = [gradient for gradient in gradients if gradient is not None]
    summed = iter(tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, present)
                  if present else [])
    return [None if gradient is None else next(summed) for gradient in gradients]


def sum_then_clip(gradients: list, clip_norm) -> list:
    """The replica-summed gradients, clipped by their global norm when `clip_norm` is set. In this order: clipping
    each replica's share before the sum clips the wrong vector."""
    gradients = sum_across_replicas(gradients)
    if clip_norm is not None:
        gradients, _ = tf.clip_by_global_norm(gradients, clip_norm)
    return gradients


def apply_summed(optimizer: keras.optimizers.Optimizer, gradients: list, variables: list,
                 clip_global_norm: float | None) -> None:
    """Sums this replica's gradients across replicas, clips the sum by its global norm (under loss scaling the
    gradients are scaled too, and so is the norm to clip them at), and applies it: with loss scaling,
    apply_gradients unscales them and skips the step if they are not finite."""
    clip_norm = None
    if clip_global_norm:
        scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        clip_norm = clip_global_norm * optimizer.dynamic_scale if scaling else clip_global_norm
    optimizer.apply_gradients(zip(sum_then_clip(gradients, clip_norm), variables, strict=True))


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
        # ValueError, not ConfigError: AutoGraph keeps a ValueError's type, and turns other types into StagingError.
        raise ValueError(f"The loss function returned shape {per_example_loss.shape}; it must return per-example "
                         f"losses of shape [{labels.shape[0]}] (reduction=None). Do not average: the training step "
                         "divides by the global batch size, which a per-replica mean gets wrong by the replica count.")


def forward(model: keras.Model, loss_fn, batch, *, global_batch_size: int, seed: int, mixing=None):
    """(logits, this replica's share of the data loss, its share of the regularization term) of a training batch
    (features, labels, positions), in training mode, with each example's dropout mask keyed by its position.
    `mixing` (tasks/augmentation/mixing.py, None = off): (features, labels, positions) -> (mixed features, soft
    targets), which the loss then takes in place of the labels."""
    features, labels, positions = batch
    targets = labels
    if mixing is not None:
        features, targets = mixing(features, labels, positions)
    if _keyed(model):  # Each example's dropout mask is keyed by its position (models/layers.py).
        with layers.example_keys(keys_from_positions(seed, positions)):
            logits = model(features, training=True)
    else:  # Nothing in the model draws per example: no keys to publish.
        logits = model(features, training=True)
    per_example_loss = loss_fn(targets, logits)
    check_per_example(per_example_loss, labels)
    loss = average_over_global_batch(per_example_loss, global_batch_size)
    regularization = regularization_share(model.losses) if model.losses else tf.zeros((), loss.dtype)
    return logits, loss, regularization


def _keyed(model: keras.Model) -> bool:
    """Whether `model` has a layer that draws from the examples' keys (StatelessDropout); decided when the step is
    traced."""
    return any(isinstance(layer, layers.StatelessDropout) for layer in model._flatten_layers(include_self=False))


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, loss_fn, *, global_batch_size: int,
                    clip_global_norm: float | None, metrics: list, seed: int, variables: list | None = None,
                    mixing=None, jit_compile: bool = False):
    """Returns train_step((features, labels, positions)) -> {'loss', 'regularization'}: this replica's shares of the
    global data loss and of the regularization term, for `strategy.run` (their SUMs over replicas are the global
    values). `positions` are the examples' training-stream positions: with `seed` they key the dropout masks
    (models/layers.py), so a mask belongs to an example, not to a replica. `variables`: the ones to update (the
    Trainer's, without the frozen ones); None = model.trainable_variables. `mixing`: as in `forward`; the metrics
    are updated against the hard labels (each example's own, its larger share). `jit_compile`: the forward and
    backward pass (not the cross-replica sum, clipping and update) in one XLA computation
    (training/jit_compile.py)."""
    disable_implicit_gradient_sum(optimizer)
    loss_scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    variables = model.trainable_variables if variables is None else list(variables)

    def forward_backward(batch):
        with tf.GradientTape() as tape:
            logits, loss, regularization = forward(model, loss_fn, batch, global_batch_size=global_batch_size,
                                                   seed=seed, mixing=mixing)
            total = loss + tf.cast(regularization, loss.dtype)
            scaled_loss = optimizer.scale_loss(total) if loss_scaling else total
        return logits, loss, regularization, tape.gradient(scaled_loss, variables)

    if jit_compile:  # Only this part: the all-reduce and apply_gradients cannot run inside XLA under Mirrored.
        forward_backward = tf.function(forward_backward, jit_compile=True)

    def train_step(batch):
        _, labels, _ = batch
        logits, loss, regularization, gradients = forward_backward(batch)
        apply_summed(optimizer, gradients, variables, clip_global_norm)
        for metric in metrics:  # Per replica; Keras sums the replicas' totals on read: no rescaling.
            metric.update(labels, logits)
        return {"loss": loss, "regularization": regularization}

    return train_step


def make_gradient_norm_step(model: keras.Model, loss_fn, *, global_batch_size: int, seed: int, mixing=None):
    """Returns step((features, labels, positions)) -> the global norm of the replica-summed gradients of the loss
    (data + regularization) at the current weights, without applying them. The replica-invariance check uses it to
    pick a clip norm that binds."""

    def gradient_norm_step(batch):
        with tf.GradientTape() as tape:
            _, loss, regularization = forward(model, loss_fn, batch, global_batch_size=global_batch_size, seed=seed,
                                              mixing=mixing)
            loss += tf.cast(regularization, loss.dtype)
        return tf.linalg.global_norm(sum_across_replicas(tape.gradient(loss, model.trainable_variables)))

    return gradient_norm_step


def make_eval_step(model: keras.Model, loss_fn, *, loss: keras.metrics.Metric, metrics: list):
    """Returns eval_step((features, labels, mask)); padding (mask 0) counts in no metric."""

    def eval_step(batch):
        features, labels, mask = batch
        logits = model(features, training=False)
        loss.update_state(tf.cast(loss_fn(labels, logits), tf.float32), sample_weight=mask)
        for metric in metrics:
            metric.update(labels, logits, sample_weight=mask)

    return eval_step
