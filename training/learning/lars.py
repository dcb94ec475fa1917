"""LARS: layer-wise adaptive rate scaling for large-batch SGD (Keras has none).

You, Gitman and Ginsburg 2017, "Large Batch Training of Convolutional Networks" (https://arxiv.org/abs/1708.03888),
Algorithm 1, in its "classic momentum" form as TF Model Garden implements it
(official/modeling/optimization/lars_optimizer.py, the optimizer of the MLPerf ResNet-50 LARS submissions). For each
variable w with summed gradient g, at learning rate lr:

    g     <- g + weight_decay * w                                   (unless excluded from weight decay)
    trust <- trust_coefficient * |w| / |g|  (1 if |w| or |g| is 0;   1 if excluded from layer adaptation)
    v     <- momentum * v + lr * trust * g
    w     <- w - v           (nesterov: w - (momentum * v + lr * trust * g))

Biases and BatchNormalization's gamma and beta are excluded from both by default ("the usual exclusion": their norms
say nothing about the layer's scale, and decaying them only hurts): variables whose `variable.path` (e.g.
'dense/bias', 'batch_normalization_3/gamma') matches any of the regular expressions, by `re.search`. The exclusion is
decided per variable when the optimizer is built, in Python: the update is plain tensor math (XLA compiles it).

Distributed: Keras calls `update_step` once per variable with the already-summed gradient (training/learning/step.py
sums them and switches Keras' own all-reduce off), on each replica's copy: the norms are of the whole variable and
the same on every replica.
"""

import re

import keras
from keras import ops

DEFAULT_EXCLUDE = ("bias", "batch_normalization|batchnorm|bn", "layer_normalization|layernorm")


def matches_any(path: str, patterns) -> bool:
    """Whether `path` matches one of the regular expressions `patterns` (re.search, so a pattern may match any
    part of the path)."""
    return any(re.search(pattern, path) for pattern in patterns or ())


class LARS(keras.optimizers.Optimizer):
    """Momentum SGD with a per-variable trust ratio (see the module docstring). `weight_decay` here is the L2
    coefficient inside the trust ratio, as in the paper; the Keras base's decoupled weight decay stays off."""

    def __init__(self, learning_rate=0.1, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = 0.001, nesterov: bool = False,
                 exclude_from_weight_decay=DEFAULT_EXCLUDE, exclude_from_layer_adaptation=None, name: str = "lars",
                 **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum = momentum
        self.weight_decay_rate = weight_decay
        self.trust_coefficient = trust_coefficient
        self.nesterov = nesterov
        self.exclude_from_weight_decay_patterns = tuple(exclude_from_weight_decay or ())
        # None: the same as exclude_from_weight_decay (as in Model Garden).
        self.exclude_from_layer_adaptation_patterns = (self.exclude_from_weight_decay_patterns
                                                       if exclude_from_layer_adaptation is None
                                                       else tuple(exclude_from_layer_adaptation))

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums = self.add_optimizer_variables(var_list, "momentum")
        # Per variable: (decayed, adapted), by path, decided once.
        self._treatment = {self._var_key(variable): self.treatment(variable.path) for variable in var_list}

    def treatment(self, path: str) -> tuple[bool, bool]:
        """(weight decay applies, the trust ratio applies) for the variable at `path`."""
        decayed = bool(self.weight_decay_rate) and not matches_any(path, self.exclude_from_weight_decay_patterns)
        return decayed, not matches_any(path, self.exclude_from_layer_adaptation_patterns)

    def update_step(self, gradient, variable, learning_rate):
        decayed, adapted = self._treatment[self._var_key(variable)]
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        if decayed:
            gradient = gradient + self.weight_decay_rate * variable  # Python floats: exact in float64.
        if adapted:
            weight_norm = ops.sqrt(ops.sum(ops.square(variable)))
            gradient_norm = ops.sqrt(ops.sum(ops.square(gradient)))
            trust = ops.where(ops.greater(weight_norm, 0),
                              ops.where(ops.greater(gradient_norm, 0),
                                        self.trust_coefficient * weight_norm / gradient_norm, 1.0), 1.0)
            learning_rate = learning_rate * ops.cast(trust, variable.dtype)
        momentum = self._momentums[self._get_variable_index(variable)]
        velocity = self.momentum * momentum + learning_rate * gradient
        self.assign(momentum, velocity)
        if self.nesterov:
            self.assign_sub(variable, self.momentum * velocity + learning_rate * gradient)
        else:
            self.assign_sub(variable, velocity)

    def get_config(self):
        config = super().get_config()
        config.update({"momentum": self.momentum, "weight_decay": self.weight_decay_rate,
                       "trust_coefficient": self.trust_coefficient, "nesterov": self.nesterov,
                       "exclude_from_weight_decay": list(self.exclude_from_weight_decay_patterns),
                       "exclude_from_layer_adaptation": list(self.exclude_from_layer_adaptation_patterns)})
        return config
