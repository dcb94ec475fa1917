"""Per-example losses by name (`experiment.loss`; None = the task's default).

A loss function maps (targets [B], model outputs [B, C]) to per-example losses [B] and never averages: the training step
divides by the *global* batch in one place (training/learning/step.py). Returning a scalar (a per-replica mean is the
silent factor-of-R bug) is rejected before training starts (`check_per_example_losses`, a ConfigError), and again when
the step is traced.
"""

import gin
import keras
import tensorflow as tf

from common.errors import ConfigError
from common.registry import lookup


@gin.configurable
def softmax_cross_entropy(labels: tf.Tensor, logits: tf.Tensor, *, label_smoothing: float = 0.0) -> tf.Tensor:
    """Cross-entropy of integer labels [B] (or soft targets [B, C]: mixup, cutmix) against logits, per example:
    float32, or float64 for float64 logits."""
    if logits.dtype != tf.float64:  # bfloat16/float16 logits: a float32 softmax.
        logits = tf.cast(logits, tf.float32)
    if labels.shape.rank == 2:
        return soft_target_cross_entropy(labels, logits, label_smoothing=label_smoothing)
    if label_smoothing:
        one_hot = tf.one_hot(labels, tf.shape(logits)[-1], dtype=logits.dtype)
        return keras.losses.categorical_crossentropy(one_hot, logits, from_logits=True,
                                                     label_smoothing=label_smoothing)
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def soft_target_cross_entropy(targets: tf.Tensor, logits: tf.Tensor, *, label_smoothing: float = 0.0) -> tf.Tensor:
    """-sum_c t_c log softmax(logits)_c per example, for targets [B, C] that sum to 1 per row. Label smoothing mixes
    the targets with the uniform distribution, t (1 - eps) + eps / C: on one-hot targets it is the integer-label
    loss's smoothing, and it commutes with mixing (smoothing two labels then mixing them = mixing then smoothing)."""
    targets = tf.cast(targets, logits.dtype)
    if label_smoothing:
        targets = targets * (1.0 - label_smoothing) + label_smoothing / tf.cast(tf.shape(logits)[-1], logits.dtype)
    return -tf.reduce_sum(targets * tf.nn.log_softmax(logits, axis=-1), axis=-1)


@gin.configurable
def mean_squared_error(targets: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    """(output - target)^2 per example, for regression tasks whose model outputs one number ([B, 1])."""
    outputs = outputs[:, 0] if outputs.dtype == tf.float64 else tf.cast(outputs[:, 0], tf.float32)
    return tf.math.squared_difference(outputs, tf.cast(targets, outputs.dtype))


LOSSES = {"softmax_cross_entropy": softmax_cross_entropy, "mean_squared_error": mean_squared_error}
# The task kind (Task.kind) each shipped loss is for; a loss you register without a kind is not checked.
LOSS_KINDS = {"softmax_cross_entropy": "classification", "mean_squared_error": "regression"}


def get_loss(name: str, task=None):
    """The loss registered as `name`; with `task`, a ConfigError if the loss is for another kind of task (mean
    squared error on class ids trains to chance without an error; cross-entropy on real targets fails mid-run)."""
    loss = lookup(LOSSES, name, named=f"loss {name!r}", known="losses", where="training/learning/losses.py")
    kind = LOSS_KINDS.get(name)
    if task is not None and kind is not None and kind != task.kind:
        raise ConfigError(f"experiment.loss={name!r} is a {kind} loss; {type(task).__name__} is a {task.kind} task. "
                          f"Use {task.default_loss!r} (its default: leave experiment.loss unset) or another "
                          f"{task.kind} loss.")
    return loss


def check_per_example_losses(loss_fn, name: str, target_spec: tf.TensorSpec, output) -> None:
    """Traces `loss_fn` (named `name` in messages) on a symbolic batch of 2 targets like `target_spec` and model
    outputs like `output` (a Keras tensor); a result that is not one loss per example is a ConfigError naming the fix.

    Runs once when a Trainer is built, before any data is read or any step traced: inside the step's trace the same
    mistake can only surface as an exception wrapped by AutoGraph. Models with several outputs are left to that
    in-trace check."""
    if not isinstance(output, keras.KerasTensor):
        return
    batch = 2
    targets = tf.TensorSpec([batch, *target_spec.shape[1:]], target_spec.dtype)
    outputs = tf.TensorSpec([batch, *output.shape[1:]], output.dtype)
    result = tf.function(loss_fn).get_concrete_function(targets, outputs).structured_outputs
    if not isinstance(result, tf.Tensor) or result.shape.as_list() != [batch]:
        shape = result.shape if isinstance(result, tf.Tensor) else type(result).__name__
        raise ConfigError(f"experiment.loss={name!r} returned {shape} for a batch of {batch} examples; a loss must "
                          f"return one loss per example, shape [{batch}] (keras losses: reduction=None). Do not "
                          "average: the training step divides by the global batch size, which a per-replica mean "
                          "gets wrong by the replica count.")
