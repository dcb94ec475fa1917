"""Learning-rate schedules by name (`experiment.lr_schedule`); their settings are gin-bound keyword arguments.

A schedule maps (peak learning rate, TRAIN_STEPS) to a Keras schedule of the optimizer step (or a number). Each is a
function of the step and of TRAIN_STEPS only, so a resumed run continues on the same curve. The warm-up of 'cosine',
'step' and 'polynomial' rises linearly from 0 at step 0 to the peak at `warmup_steps` (Goyal et al. 2017, "Accurate,
Large Minibatch SGD", https://arxiv.org/abs/1706.02677, section 2.2: "gradual warmup"). Bad settings raise a
ConfigError naming the value and the fix, when the optimizer is made (before training starts).
"""

import gin
import keras
import tensorflow as tf

from common.errors import ConfigError


@gin.configurable
def constant(learning_rate: float, train_steps: int):
    del train_steps
    return learning_rate


def _check_warmup(name: str, warmup_steps, train_steps: int) -> int:
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or not 0 <= warmup_steps < train_steps:
        raise ConfigError(f"{name}.warmup_steps={warmup_steps!r} must be an integer >= 0 and < TRAIN_STEPS="
                          f"{train_steps}: lower {name}.warmup_steps or raise TRAIN_STEPS.")
    return warmup_steps


@gin.configurable
def cosine(learning_rate: float, train_steps: int, *, warmup_steps: int = 0, final_fraction: float = 0.0):
    """Linear warm-up from 0 over `warmup_steps`, then cosine decay to `final_fraction * learning_rate`."""
    warmup_steps = _check_warmup("cosine", warmup_steps, train_steps)
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup_steps else learning_rate, decay_steps=train_steps - warmup_steps,
        alpha=final_fraction, warmup_target=learning_rate if warmup_steps else None, warmup_steps=warmup_steps)


class WarmupThen(keras.optimizers.schedules.LearningRateSchedule):
    """learning_rate * step / warmup_steps up to `warmup_steps`, then `after(step)`. Plain tensor math on the
    step (no Python branches on it): it traces once and compiles with XLA."""

    def __init__(self, learning_rate: float, warmup_steps: int, after):
        self.learning_rate, self.warmup_steps, self.after = learning_rate, warmup_steps, after

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        if not self.warmup_steps:
            return self.after(step)
        warmup = self.learning_rate * step / float(self.warmup_steps)
        return tf.where(step < float(self.warmup_steps), warmup, self.after(step))

    def get_config(self):  # For display: `after` is a closure, so this schedule is not rebuilt from its config.
        return {"learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps}


def _boundary_steps(boundaries, train_steps: int, warmup_steps: int) -> list[int]:
    """`boundaries` as optimizer steps: all fractions of TRAIN_STEPS (floats in (0, 1)) or all steps (integers);
    strictly increasing, after the warm-up and before TRAIN_STEPS (a boundary at or after the end never applies)."""
    values = list(boundaries) if isinstance(boundaries, (list, tuple)) else None
    example = "e.g. --gin_param=\"step.boundaries=[0.333, 0.667, 0.889]\" (fractions of TRAIN_STEPS)"
    if not values or any(isinstance(value, bool) or not isinstance(value, (int, float)) for value in values):
        raise ConfigError(f"step.boundaries={boundaries!r} must be a non-empty list of numbers; {example}.")
    fractions = all(isinstance(value, float) for value in values)
    if fractions and not all(0 < value < 1 for value in values):
        raise ConfigError(f"step.boundaries={boundaries!r}: floats are fractions of TRAIN_STEPS and must lie in "
                          f"(0, 1); give steps as integers instead, or {example}.")
    if not fractions and not all(isinstance(value, int) for value in values):
        raise ConfigError(f"step.boundaries={boundaries!r} mixes fractions (floats) and steps (integers): use one "
                          f"kind; {example}.")
    steps = [int(round(value * train_steps)) for value in values] if fractions else values
    if any(later <= earlier for earlier, later in zip(steps, steps[1:], strict=False)):
        raise ConfigError(f"step.boundaries={boundaries!r} (steps {steps}) must be strictly increasing; {example}.")
    if steps[0] <= warmup_steps or steps[-1] >= train_steps:
        raise ConfigError(f"step.boundaries={boundaries!r} (steps {steps}) must lie after step.warmup_steps="
                          f"{warmup_steps} and before TRAIN_STEPS={train_steps}: move the boundaries inside, lower "
                          "step.warmup_steps or raise TRAIN_STEPS.")
    return steps


@gin.configurable
def step(learning_rate: float, train_steps: int, *, boundaries=(0.333, 0.667, 0.889), multipliers=None,
         warmup_steps: int = 0):
    """Piecewise constant: `learning_rate * multipliers[i]` after the i-th boundary (multipliers[0] before the
    first), after a linear warm-up. Boundaries: fractions of TRAIN_STEPS (floats) or steps (integers); the default is
    ResNet's decay at epochs 30, 60 and 80 of 90 (He et al. 2016; Goyal et al. 2017). multipliers=None: 0.1 ** i."""
    warmup_steps = _check_warmup("step", warmup_steps, train_steps)
    steps = _boundary_steps(boundaries, train_steps, warmup_steps)
    if multipliers is None:
        multipliers = [0.1 ** index for index in range(len(steps) + 1)]
    if (not isinstance(multipliers, (list, tuple)) or len(multipliers) != len(steps) + 1
            or any(isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
                   for value in multipliers)):
        raise ConfigError(f"step.multipliers={multipliers!r} must be {len(steps) + 1} numbers >= 0 (one more than "
                          f"step.boundaries has), e.g. --gin_param=\"step.multipliers="
                          f"{[round(0.1 ** index, 6) for index in range(len(steps) + 1)]}\", or None for 0.1 ** i.")
    rates = tf.constant([learning_rate * value for value in multipliers], tf.float32)
    boundary_steps = tf.constant(steps, tf.float32)

    def after(current):  # The number of boundaries passed indexes the rate.
        passed = tf.reduce_sum(tf.cast(current >= boundary_steps, tf.int32))
        return tf.gather(rates, passed)

    return WarmupThen(learning_rate, warmup_steps, after)


@gin.configurable
def polynomial(learning_rate: float, train_steps: int, *, warmup_steps: int = 0, power: float = 2.0,
               end_learning_rate: float = 0.0):
    """Linear warm-up, then (learning_rate - end) * (1 - t / T) ** power + end over the T = TRAIN_STEPS -
    warmup_steps steps after it: the LARS recipes' decay (power 2; You et al. 2017, MLPerf ResNet-50)."""
    warmup_steps = _check_warmup("polynomial", warmup_steps, train_steps)
    if isinstance(power, bool) or not isinstance(power, (int, float)) or power <= 0:
        raise ConfigError(f"polynomial.power={power!r} must be a number > 0; e.g. "
                          "--gin_param=\"polynomial.power=2.0\".")
    if (isinstance(end_learning_rate, bool) or not isinstance(end_learning_rate, (int, float))
            or not 0 <= end_learning_rate <= learning_rate):
        raise ConfigError(f"polynomial.end_learning_rate={end_learning_rate!r} must be a number in [0, LEARNING_RATE="
                          f"{learning_rate}]; e.g. --gin_param=\"polynomial.end_learning_rate=0.0001\".")
    decay_steps = float(train_steps - warmup_steps)

    def after(current):
        remaining = 1.0 - tf.minimum(current - warmup_steps, decay_steps) / decay_steps
        return (learning_rate - end_learning_rate) * remaining ** float(power) + end_learning_rate

    return WarmupThen(learning_rate, warmup_steps, after)


SCHEDULES = {"constant": constant, "cosine": cosine, "step": step, "polynomial": polynomial}


def warmup_steps_bound() -> int:
    """The warm-up steps gin binds for any schedule (the largest): how long a check must run to leave it."""
    bound = 0
    for name in ("cosine", "step", "polynomial"):
        try:
            bound = max(bound, int(gin.query_parameter(f"{name}.warmup_steps")))
        except ValueError:
            pass
    return bound
