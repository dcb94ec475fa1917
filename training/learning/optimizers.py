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


def _decay_rate(name: str, value, example: float) -> float:
    """`value` as a float in [0, 1), else a ConfigError: a decay rate (momentum, beta) of 1 or more makes the moving
    averages grow without end, and Keras would answer with a traceback (momentum) or train on (betas)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"{name}={value!r} must be a number in [0, 1) (0 <= {name.split('.')[1]} < 1); e.g. "
                          f"--gin_param=\"{name}={example}\".")
    return float(value)


@gin.configurable
def sgd(learning_rate, *, momentum: float = 0.0, nesterov: bool = False, weight_decay: float | None = None):
    momentum = _decay_rate("sgd.momentum", momentum, 0.9)
    return keras.optimizers.SGD(learning_rate, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)


@gin.configurable
def adam(learning_rate, *, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7):
    beta_1, beta_2 = _decay_rate("adam.beta_1", beta_1, 0.9), _decay_rate("adam.beta_2", beta_2, 0.999)
    return keras.optimizers.Adam(learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)


@gin.configurable
def adamw(learning_rate, *, weight_decay: float = 0.004, beta_1: float = 0.9, beta_2: float = 0.999):
    beta_1, beta_2 = _decay_rate("adamw.beta_1", beta_1, 0.9), _decay_rate("adamw.beta_2", beta_2, 0.999)
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
