"""Is training healthy? A compiled all-finite check of the weights and optimizer state, and a divergence warning.

The loss a loop reports is computed before the loop's last update, so a finite loss does not prove finite
weights: `make_finite_check` checks every floating-point model and optimizer variable on the device after each
loop (one fused reduction, compiled once), and the host loop refuses to checkpoint state that fails it.
`DivergenceMonitor` warns when the loss grows by orders of magnitude while staying finite (e.g. a learning rate
of 1e12), which otherwise ends at chance accuracy with exit 0.
"""

import logging
import math

import tensorflow as tf

log = logging.getLogger(__name__)

DIVERGENCE_FACTOR = 100.0  # Warn when a loop's loss exceeds the lowest loop loss so far by this factor ...
DIVERGENCE_FLOOR = 10.0  # ... and this absolute value (cross-entropy starts near ln(classes), 2.3 for 10).


def _floating(variables) -> list:
    unique = {id(variable): variable for variable in variables}
    return [variable for variable in unique.values() if tf.as_dtype(variable.dtype).is_floating]


def make_finite_check(variables):
    """Returns all_finite() -> bool: whether every floating-point value of `variables` is finite."""
    floating = _floating(variables)

    @tf.function
    def all_finite():
        flags = [tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(variable))) for variable in floating]
        return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)

    return lambda: bool(all_finite())


def non_finite_names(variables, limit: int = 5) -> list[str]:
    """Names of (up to `limit`) variables holding NaN or inf; eager, for the error message only."""
    names = [variable.path if hasattr(variable, "path") else variable.name for variable in _floating(variables)
             if not bool(tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(variable))))]
    return names[:limit] + ([f"... {len(names) - limit} more"] if len(names) > limit else [])


class DivergenceMonitor:
    """Warns when a loop's mean loss exceeds DIVERGENCE_FACTOR x the lowest so far (and DIVERGENCE_FLOOR)."""

    def __init__(self):
        self.lowest = math.inf
        self.lowest_step = None
        self._warned_at = None  # Loss of the last warning: warn again only after another DIVERGENCE_FACTOR.

    def observe(self, step: int, loss: float) -> bool:
        """Records the loss of the loop ending at `step`; returns True (and logs a warning) when it diverges."""
        if loss < self.lowest:
            self.lowest, self.lowest_step = loss, step
            return False
        diverging = loss > DIVERGENCE_FACTOR * self.lowest and loss > DIVERGENCE_FLOOR
        if diverging and (self._warned_at is None or loss >= DIVERGENCE_FACTOR * self._warned_at):
            self._warned_at = loss
            log.warning("Training is diverging: loss %.4g at step %d, %.3g times the lowest (%.4g at step %d). "
                        "Lower LEARNING_RATE or set experiment.clip_global_norm; checkpoints saved from now on "
                        "hold the diverged weights.", loss, step, loss / self.lowest, self.lowest, self.lowest_step)
        return diverging
