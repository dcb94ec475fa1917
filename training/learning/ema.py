"""EMA of the weights (EMA_DECAY): a moving average of the trained weights, kept beside them, evaluated and exported.

After every optimizer step, for each trained weight w (the Trainer's trainable variables, frozen ones excluded):

    ema = d_t * ema + (1 - d_t) * w,   d_t = 0 at the first update, else min(EMA_DECAY, (1 + t) / (10 + t))

where t counts the updates made before this one (the `updates` variable, checkpointed). The first update copies the
weights, so the average starts from the weights of step 1 whatever set the initial ones (the initialisers, INIT_FROM,
a test's set_weights); the (1 + t) / (10 + t) warm-up is tf.train.ExponentialMovingAverage's `num_updates` and Model
Garden's `dynamic_decay`: early in a run the average follows the weights closely instead of holding on to the
initial ones for ~1 / (1 - EMA_DECAY) steps. Non-trainable weights (BatchNormalization's moving statistics) have no
average: the EMA model uses the current ones, as Keras' `use_ema` does. A step that loss scaling skipped still
updates the average (towards the unchanged weights).

Why own variables rather than Keras' optimizer `use_ema`: the step already bypasses Keras' cross-replica gradient
sum (training/learning/step.py), the averages must be in the run's tf.train.Checkpoint under a name of their own (a
checkpoint written with EMA off must not restore into one with EMA on), and the swap for evaluation and export is
wanted without the optimizer's `finalize_variable_values`, which overwrites the weights for good.

Distribution: each average is a MirroredVariable created under the strategy's scope. The update runs in the
replica step, after apply_gradients, through a merge_call and `strategy.extended.update` (as Keras' optimizer
updates its slots): each device updates its own copy from its own copy of w, which every replica holds equal, so no
communication is needed and the copies stay equal.
"""

import contextlib

import tensorflow as tf

from common.errors import ConfigError
from common.settings import how_to_set

WARMUP_OFFSET = 10  # d_t <= (1 + t) / (10 + t): tf.train.ExponentialMovingAverage's num_updates warm-up.


def decay_at(update: int, decay: float) -> float:
    """d_t of the module docstring for the update that has `update` updates before it (NumPy-side twin, for tests)."""
    return 0.0 if update == 0 else min(decay, (1 + update) / (WARMUP_OFFSET + update))


class WeightAverage:
    """The EMA of `variables` (Keras variables of the model) at `decay`. Build under the strategy's scope.

    `trackable` goes into the Trainer's tf.train.Checkpoint as `ema`: `averages` (one per variable, in order) and
    `updates`. `swapped()` puts the averages into the model's weights for the duration of a block."""

    def __init__(self, variables: list, decay: float):
        self.decay = float(decay)
        self._weights = list(variables)
        self.averages = [tf.Variable(variable.value, trainable=False, name=f"ema/{variable.path}".replace(":", "_"))
                         for variable in self._weights]
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="ema/updates",
                                   aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.trackable = tf.train.Checkpoint(averages=self.averages, updates=self.updates)

    def update(self) -> None:
        """One EMA update from the current weights; called in replica context (the train step) or in none."""
        context = tf.distribute.get_replica_context()
        if context is None:  # Cross-replica context (e.g. a test calling it eagerly under the scope).
            self._update(tf.distribute.get_strategy())
        else:
            context.merge_call(self._update)

    def _update(self, strategy) -> None:
        updates = self.updates.read_value()
        t = tf.cast(updates, tf.float64)
        decay = tf.where(updates == 0, tf.constant(0.0, tf.float64),
                         tf.minimum(tf.constant(self.decay, tf.float64), (1.0 + t) / (WARMUP_OFFSET + t)))
        for average, weight in zip(self.averages, self._weights, strict=True):
            def assign(average_copy, weight_copy, decay=decay):
                d = tf.cast(decay, average_copy.dtype)
                return average_copy.assign(d * average_copy + (1 - d) * weight_copy)

            strategy.extended.update(average, assign, args=(getattr(weight, "value", weight),), group=False)
        self.updates.assign_add(1)

    def after(self, train_step):
        """`train_step` followed by one EMA update (after its apply_gradients: the same step's new weights)."""

        def train_step_then_average(batch):
            outputs = train_step(batch)
            with tf.control_dependencies(tf.nest.flatten(outputs)):
                self.update()
            return outputs

        return train_step_then_average

    def reset(self) -> None:
        """The averages set to the current weights (and the update count to 0): after a warm start."""
        for average, weight in zip(self.averages, self._weights, strict=True):
            average.assign(weight.value)
        self.updates.assign(0)

    def _swap(self) -> None:
        for average, weight in zip(self.averages, self._weights, strict=True):
            value = tf.identity(weight.value)
            weight.assign(average)
            average.assign(value)

    @contextlib.contextmanager
    def swapped(self):
        """The EMA weights in the model for the block (evaluate, export), the trained ones back afterwards, bit for
        bit: the two sets of values are exchanged, twice."""
        self._swap()
        try:
            yield
        finally:
            self._swap()


def maybe_swapped(average: "WeightAverage | None"):
    """`average.swapped()`, or a no-op block when EMA is off (None)."""
    return contextlib.nullcontext() if average is None else average.swapped()


def check_settings(config) -> dict:
    """EMA_DECAY in [0, 1); 0 is off, like None: one value for "off" downstream."""
    decay = config.ema_decay
    if decay is not None and (not isinstance(decay, (int, float)) or isinstance(decay, bool) or not 0 <= decay < 1):
        raise ConfigError(f"EMA_DECAY={decay!r} must be a number in [0, 1) (the weight of the old average per step), "
                          f"or None or 0 for off; e.g. {how_to_set('ema_decay', 0.999)}.")
    return {"ema_decay": decay or None}
