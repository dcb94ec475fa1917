"""Optimizers and learning-rate schedules by name; their hyperparameters are gin-bound keyword arguments.

Call `make_optimizer` inside `strategy.scope()` and build it before tracing (see training/trainer.py): an optimizer
made outside the scope counts `iterations` once per replica, which silently breaks learning-rate schedules.
Do not set Keras' clipnorm/clipvalue here: they clip each replica's gradients before the sum. Clipping is done on
the summed gradients in training/learning/step.py. The schedules are in training/learning/schedules.py (`SCHEDULES`,
looked up there when the optimizer is made).

Weight-decay exclusion (`exclude_from_weight_decay`: regular expressions matched against `variable.path`, e.g.
'dense/bias', 'batch_normalization/gamma'): Keras' own `exclude_from_weight_decay(var_names=...)` matches
`variable.name`, which in Keras 3 is the bare 'bias' or 'gamma' without the layer, so the patterns are resolved to the
variables by path here (`exclude_by_path`), once the model exists, before the optimizer is built.
"""

import math
import re

import gin
import keras

from common.errors import ConfigError
from common.registry import lookup
from common.settings import how_to_set
from training.learning import schedules
from training.learning.lars import DEFAULT_EXCLUDE, LARS, matches_any


def _decay_rate(name: str, value, example: float) -> float:
    """`value` as a float in [0, 1), else a ConfigError: a decay rate (momentum, beta) of 1 or more makes the moving
    averages grow without end, and Keras would answer with a traceback (momentum) or train on (betas)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"{name}={value!r} must be a number in [0, 1) (0 <= {name.split('.')[1]} < 1); e.g. "
                          f"--gin_param=\"{name}={example}\".")
    return float(value)


def _patterns(name: str, value) -> tuple[str, ...]:
    """`value` as a tuple of regular expressions, else a ConfigError naming the setting."""
    example = f"e.g. --gin_param=\"{name}=['bias', 'batch_normalization']\""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(
            isinstance(pattern, str) and pattern for pattern in value):
        raise ConfigError(f"{name}={value!r} must be a list of regular expressions matched against variable "
                          f"paths; {example}.")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ConfigError(f"{name}: {pattern!r} is not a regular expression ({error}); {example}.") from None
    return tuple(value)


def _excluding(optimizer: keras.optimizers.Optimizer, name: str, patterns) -> keras.optimizers.Optimizer:
    """Records the weight-decay exclusion patterns on `optimizer`, for `exclude_by_path` to resolve."""
    optimizer.exclude_from_weight_decay_patterns = _patterns(name, patterns)
    return optimizer


def _non_negative(name: str, value, example) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{name}={value!r} must be a number >= 0; e.g. --gin_param=\"{name}={example}\".")
    return float(value)


@gin.configurable
def sgd(learning_rate, *, momentum: float = 0.0, nesterov: bool = False, weight_decay: float | None = None,
        exclude_from_weight_decay=None):
    """Keras SGD; `weight_decay` is decoupled (w -= learning_rate * weight_decay * w each step), except for the
    variables whose path matches a pattern of `exclude_from_weight_decay`."""
    momentum = _decay_rate("sgd.momentum", momentum, 0.9)
    return _excluding(keras.optimizers.SGD(learning_rate, momentum=momentum, nesterov=nesterov,
                                           weight_decay=weight_decay),
                      "sgd.exclude_from_weight_decay", exclude_from_weight_decay)


@gin.configurable
def adam(learning_rate, *, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7):
    beta_1, beta_2 = _decay_rate("adam.beta_1", beta_1, 0.9), _decay_rate("adam.beta_2", beta_2, 0.999)
    return keras.optimizers.Adam(learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)


@gin.configurable
def adamw(learning_rate, *, weight_decay: float = 0.004, beta_1: float = 0.9, beta_2: float = 0.999,
          exclude_from_weight_decay=None):
    """Keras AdamW (decoupled weight decay), except for the variables whose path matches a pattern of
    `exclude_from_weight_decay` (e.g. ['bias', 'normalization'])."""
    beta_1, beta_2 = _decay_rate("adamw.beta_1", beta_1, 0.9), _decay_rate("adamw.beta_2", beta_2, 0.999)
    return _excluding(keras.optimizers.AdamW(learning_rate, weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2),
                      "adamw.exclude_from_weight_decay", exclude_from_weight_decay)


@gin.configurable
def lamb(learning_rate, *, weight_decay: float = 0.01, beta_1: float = 0.9, beta_2: float = 0.999,
         epsilon: float = 1e-6, exclude_from_weight_decay=DEFAULT_EXCLUDE):
    """Keras Lamb (You et al. 2019, https://arxiv.org/abs/1904.00962): Adam's step scaled per variable by
    |w| / |step|. Keras applies `weight_decay` decoupled, before that step (w -= learning_rate * weight_decay * w),
    not inside the trust ratio as the paper's Algorithm 2 does; every variable gets the trust ratio (Keras has no
    exclusion from it); `exclude_from_weight_decay` (path patterns) exempts biases and normalization by default."""
    beta_1, beta_2 = _decay_rate("lamb.beta_1", beta_1, 0.9), _decay_rate("lamb.beta_2", beta_2, 0.999)
    weight_decay = _non_negative("lamb.weight_decay", weight_decay, 0.01)
    return _excluding(keras.optimizers.Lamb(learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                                            weight_decay=weight_decay or None),
                      "lamb.exclude_from_weight_decay", exclude_from_weight_decay)


@gin.configurable
def lars(learning_rate, *, momentum: float = 0.9, weight_decay: float = 1e-4, trust_coefficient: float = 0.001,
         nesterov: bool = False, exclude_from_weight_decay=DEFAULT_EXCLUDE, exclude_from_layer_adaptation=None):
    """LARS (training/learning/lars.py): momentum SGD with a per-variable trust ratio; biases and BatchNormalization
    excluded from weight decay and the trust ratio by default (exclude_from_layer_adaptation=None: the same
    patterns as exclude_from_weight_decay)."""
    momentum = _decay_rate("lars.momentum", momentum, 0.9)
    weight_decay = _non_negative("lars.weight_decay", weight_decay, 1e-4)
    trust_coefficient = _non_negative("lars.trust_coefficient", trust_coefficient, 0.001)
    return LARS(learning_rate, momentum=momentum, weight_decay=weight_decay, trust_coefficient=trust_coefficient,
                nesterov=nesterov,
                exclude_from_weight_decay=_patterns("lars.exclude_from_weight_decay", exclude_from_weight_decay),
                exclude_from_layer_adaptation=None if exclude_from_layer_adaptation is None else _patterns(
                    "lars.exclude_from_layer_adaptation", exclude_from_layer_adaptation))


OPTIMIZERS = {"sgd": sgd, "adam": adam, "adamw": adamw, "lamb": lamb, "lars": lars}


def exclude_by_path(optimizer: keras.optimizers.Optimizer, variables) -> list:
    """Exempts from Keras' weight decay the `variables` whose path matches the optimizer's
    `exclude_from_weight_decay_patterns` (before the optimizer is built); returns them. LARS does its own."""
    patterns = getattr(optimizer, "exclude_from_weight_decay_patterns", ())
    if isinstance(optimizer, LARS) or not patterns:
        return []
    excluded = [variable for variable in variables if matches_any(variable.path, patterns)]
    optimizer.exclude_from_weight_decay(var_list=excluded)
    return excluded


def make_optimizer(name: str, *, learning_rate: float, schedule: str, train_steps: int,
                   variables=()) -> keras.optimizers.Optimizer:
    """The optimizer `name` driven by the learning-rate schedule `schedule`; `variables` (the model's) are where
    its weight-decay exclusion patterns apply."""
    optimizer = lookup(OPTIMIZERS, name, named=f"experiment.optimizer={name!r}", known="optimizers",
                       where="training/learning/optimizers.py",
                       hint="; e.g. --gin_param=\"experiment.optimizer='adam'\"")
    make_schedule = lookup(schedules.SCHEDULES, schedule, named=f"experiment.lr_schedule={schedule!r}",
                           known="schedules",
                           where="training/learning/schedules.py",
                           hint="; e.g. --gin_param=\"experiment.lr_schedule='cosine'\"")
    optimizer = optimizer(make_schedule(learning_rate, train_steps))
    exclude_by_path(optimizer, variables)
    return optimizer


def check_settings(config) -> None:
    """LEARNING_RATE and experiment.clip_global_norm (the optimizer and schedule by name when they are made)."""
    rate = config.learning_rate
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 < rate < math.inf:
        raise ConfigError(f"LEARNING_RATE={rate!r} must be a finite number > 0; e.g. "
                          f"{how_to_set('learning_rate', 0.01)}.")
    if config.clip_global_norm is not None and not config.clip_global_norm > 0:
        raise ConfigError(f"experiment.clip_global_norm={config.clip_global_norm!r} must be > 0, or None to disable "
                          f"clipping; e.g. {how_to_set('clip_global_norm', 1.0)}.")
