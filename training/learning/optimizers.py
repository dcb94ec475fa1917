"""Optimizers and learning-rate schedules by name; their hyperparameters are gin-bound keyword arguments.

Call `make_optimizer` inside `strategy.scope()` and build it before tracing (see training/trainer.py): an optimizer
made outside the scope counts `iterations` once per replica, which silently breaks learning-rate schedules.
Do not set Keras' clipnorm/clipvalue here: they clip each replica's gradients before the sum. Clipping is done on
the summed gradients in training/learning/step.py.
"""

import gin
import keras

from common.errors import ConfigError
from common.registry import lookup


@gin.configurable
def constant(learning_rate: float, train_steps: int):
    del train_steps
    return learning_rate


@gin.configurable
def cosine(learning_rate: float, train_steps: int, *, warmup_steps: int = 0, final_fraction: float = 0.0):
    """Linear warm-up from 0 over `warmup_steps`, then cosine decay to `final_fraction * learning_rate`."""
    if not 0 <= warmup_steps < train_steps:
        raise ConfigError(f"cosine.warmup_steps={warmup_steps} must be >= 0 and < TRAIN_STEPS={train_steps}.")
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup_steps else learning_rate, decay_steps=train_steps - warmup_steps,
        alpha=final_fraction, warmup_target=learning_rate if warmup_steps else None, warmup_steps=warmup_steps)


@gin.configurable
def sgd(learning_rate, *, momentum: float = 0.0, nesterov: bool = False, weight_decay: float | None = None):
    return keras.optimizers.SGD(learning_rate, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)


@gin.configurable
def adam(learning_rate, *, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7):
    return keras.optimizers.Adam(learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)


@gin.configurable
def adamw(learning_rate, *, weight_decay: float = 0.004, beta_1: float = 0.9, beta_2: float = 0.999):
    return keras.optimizers.AdamW(learning_rate, weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2)


SCHEDULES = {"constant": constant, "cosine": cosine}
OPTIMIZERS = {"sgd": sgd, "adam": adam, "adamw": adamw}


def make_optimizer(name: str, *, learning_rate: float, schedule: str, train_steps: int) -> keras.optimizers.Optimizer:
    """The optimizer `name` driven by the learning-rate schedule `schedule`."""
    optimizer = lookup(OPTIMIZERS, name, named=f"experiment.optimizer={name!r}", known="optimizers",
                       where="training/learning/optimizers.py",
                       hint="; e.g. --gin_param=\"experiment.optimizer='adam'\"")
    make_schedule = lookup(SCHEDULES, schedule, named=f"experiment.lr_schedule={schedule!r}", known="schedules",
                           where="training/learning/optimizers.py",
                           hint="; e.g. --gin_param=\"experiment.lr_schedule='cosine'\"")
    return optimizer(make_schedule(learning_rate, train_steps))
