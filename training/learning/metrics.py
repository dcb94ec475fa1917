"""Metrics by name (`experiment.metrics`, a gin list; None = the task's defaults), for training and evaluation.

    experiment.metrics = ['accuracy', 'top_5_accuracy']          # classification
    experiment.metrics = ['accuracy', 'auc', 'precision', 'recall']  # two classes
    experiment.metrics = ['mean_absolute_error', 'mean_squared_error']  # regression

Each is a Keras metric updated per replica inside the compiled step, weighted by the eval mask (padding counts in
none), and read once per loop or evaluation: Keras sums the replicas' totals and counts on read, so the value is
that of the whole batch or split at any replica count. Nothing is rescaled. To add one, add a factory to METRICS:
(task, name) -> Metric, with a `transform` that maps (targets, model outputs) to what the Keras metric expects.
"""

import re
from collections.abc import Callable

import keras
import tensorflow as tf

from common.errors import ConfigError
from common.registry import lookup
from common.settings import require_names


class Metric:
    """A named Keras metric and how it reads (targets, model outputs)."""

    def __init__(self, name: str, metric: keras.metrics.Metric, transform: Callable):
        self.name, self.metric, self._transform = name, metric, transform

    def update(self, targets: tf.Tensor, outputs: tf.Tensor, sample_weight: tf.Tensor | None = None) -> None:
        targets, predictions = self._transform(targets, tf.cast(outputs, tf.float32))
        self.metric.update_state(targets, predictions, sample_weight=sample_weight)

    def result(self) -> float:
        return float(self.metric.result().numpy())

    def reset(self) -> None:
        self.metric.reset_state()


def _logits(targets, outputs):
    return targets, outputs


def _positive_probability(targets, outputs):
    return targets, tf.nn.softmax(outputs)[:, 1]


def _first_output(targets, outputs):
    # [B, 1] both: Keras' error metrics average over the last axis, then over examples.
    return tf.cast(targets, tf.float32)[:, tf.newaxis], outputs[:, :1]


def _classification(task, name):
    if task.kind != "classification":
        raise ConfigError(f"Metric {name!r} needs a classification task; {type(task).__name__} is a {task.kind} task "
                          f"(try {', '.join(task.default_metrics)}).")


def _binary(task, name):
    _classification(task, name)
    if task.output_size != 2:
        raise ConfigError(f"Metric {name!r} is for two classes (class 1 is the positive one); this task has "
                          f"{task.output_size}. Use 'accuracy' or 'top_K_accuracy'.")


def _regression(task, name):
    if task.kind != "regression":
        raise ConfigError(f"Metric {name!r} needs a regression task; {type(task).__name__} is a {task.kind} task.")


def _accuracy(task, name):
    _classification(task, name)
    return Metric(name, keras.metrics.SparseCategoricalAccuracy(name), _logits)


def _top_k_accuracy(task, name):
    _classification(task, name)
    k = int(re.fullmatch(r"top_(\d+)_accuracy", name).group(1))
    if not 1 <= k <= task.output_size:
        raise ConfigError(f"Metric {name!r}: k={k} must be between 1 and the {task.output_size} classes.")
    return Metric(name, keras.metrics.SparseTopKCategoricalAccuracy(k, name=name), _logits)


def _auc(task, name):
    _binary(task, name)
    # 1,000 thresholds: within ~1e-3 of the exact (rank-based) area.
    return Metric(name, keras.metrics.AUC(num_thresholds=1000, name=name), _positive_probability)


def _precision(task, name):
    _binary(task, name)
    return Metric(name, keras.metrics.Precision(thresholds=0.5, name=name), _positive_probability)


def _recall(task, name):
    _binary(task, name)
    return Metric(name, keras.metrics.Recall(thresholds=0.5, name=name), _positive_probability)


def _mean_absolute_error(task, name):
    _regression(task, name)
    return Metric(name, keras.metrics.MeanAbsoluteError(name), _first_output)


def _mean_squared_error(task, name):
    _regression(task, name)
    return Metric(name, keras.metrics.MeanSquaredError(name), _first_output)


METRICS: dict[str, Callable] = {
    "accuracy": _accuracy,
    "top_K_accuracy": _top_k_accuracy,  # e.g. top_5_accuracy
    "auc": _auc,
    "precision": _precision,
    "recall": _recall,
    "mean_absolute_error": _mean_absolute_error,
    "mean_squared_error": _mean_squared_error,
}


def make_metrics(names, task) -> list[Metric]:
    """The metrics `names` (or the task's defaults) for `task`; call inside `strategy.scope()`."""
    if names is not None and "loss" in names:  # Before the lookup, which would call it an unknown metric.
        raise ConfigError(f"experiment.metrics={list(names)}: 'loss' is always reported; do not list it in "
                          "experiment.metrics.")
    metrics = []
    for name in names if names is not None else task.default_metrics:
        factory = lookup(METRICS, "top_K_accuracy" if re.fullmatch(r"top_\d+_accuracy", name) else name,
                         named=f"metric {name!r}", known="metrics", note=" (top_K: e.g. top_5_accuracy)",
                         where="training/learning/metrics.py")
        metrics.append(factory(task, name))
    if len({metric.name for metric in metrics}) != len(metrics):
        raise ConfigError(f"experiment.metrics={list(names)} names a metric twice; list each once.")
    return metrics


def check_settings(config) -> dict:
    """experiment.metrics: a list of names (looked up in METRICS when the task is known), or None for the task's."""
    return {"metrics": require_names("metrics", config.metrics, "['accuracy', 'top_5_accuracy']")}
