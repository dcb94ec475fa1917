"""The task seam (tasks/): tabular classification and regression as worked examples, metrics by name, and exports
that serve the raw features as the dataset stores them.

Each worked example trains offline through train.py to what its config header states, reports metrics equal to a
NumPy computation over the whole eval split at 1 and 3 replicas, and exports a SavedModel that serves raw rows. Its
float64 replica-invariance check at 1, 2 and 4 replicas is one of the cases in tests/test_replica_invariance.py.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from common.errors import ConfigError
from helpers import run_train_py, shipped_config, trainer_with_trained_weights
from tpu_utils.strategy import make_strategy
from training.trainer import Trainer

CLASSIFICATION = "configs/experiments/breast_cancer_mlp.gin"
REGRESSION = "configs/experiments/synthetic_housing_mlp.gin"



@pytest.mark.slow
@pytest.mark.parametrize("config_file, metric, bound", [(CLASSIFICATION, "accuracy", 0.93),
                                                        (REGRESSION, "mean_absolute_error", 0.2)])
def test_each_worked_example_reaches_its_stated_result_and_serves_raw_rows(tmp_path, data_dir, config_file, metric,
                                                                           bound):
    model_dir = str(tmp_path / "run")
    result = run_train_py(f"--gin_file={config_file}", f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    value = metrics["eval"][metric]
    assert value >= bound if metric == "accuracy" else value <= bound, metrics

    # The export takes raw float rows (not standardised ones) and applies the training preprocessing itself.
    config = shipped_config(config_file)
    trainer = Trainer(config, make_strategy("default"), training=False)
    rows = tfds.as_numpy(trainer.builder.as_dataset(split="test", batch_size=8).take(1))
    rows = next(iter(rows))
    served = tf.saved_model.load(os.path.join(model_dir, "export", str(config.train_steps)))
    outputs = served.signatures["serving_default"](features=tf.constant(rows["features"]))
    if metric == "accuracy":
        assert outputs["class_names"].dtype == tf.string
        names = [name.decode() for name in outputs["class_names"].numpy()]
        assert set(names) <= {"malignant", "benign"}
        assert np.mean(outputs["classes"].numpy() == rows["label"]) >= 0.75  # 8 raw rows, mostly right.
    else:
        assert np.mean(np.abs(outputs["predictions"].numpy() - rows["target"])) < 0.5


def _binary_numpy_metrics(logits, labels):
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    positive = probabilities[:, 1]
    predicted = positive >= 0.5
    true_positive = np.sum(predicted & (labels == 1))
    # Exact (rank-based) AUC: the chance a positive example scores above a negative one.
    positives, negatives = positive[labels == 1], positive[labels == 0]
    auc = np.mean(positives[:, None] > negatives[None, :]) + 0.5 * np.mean(positives[:, None] == negatives[None, :])
    return {"loss": float(-np.log(probabilities[np.arange(len(labels)), labels]).mean()),
            "accuracy": float(np.mean(np.argmax(logits, axis=1) == labels)),
            "precision": float(true_positive / max(predicted.sum(), 1)),
            "recall": float(true_positive / max((labels == 1).sum(), 1)), "auc": float(auc)}


@pytest.mark.parametrize("replicas", [1, 3])
def test_classification_metrics_equal_numpy_over_the_whole_split(data_dir, replicas):
    """114 test rows, eval batch 24 (8 per replica at 3): the last batch is padded, and padding counts in nothing."""
    config = shipped_config(CLASSIFICATION, "GLOBAL_BATCH_SIZE=48", "experiment.eval_batch_size=24",
                            "STRATEGY='mirrored'", f"VIRTUAL_DEVICES={replicas}",
                            "experiment.metrics=['accuracy', 'auc', 'precision', 'recall', 'top_1_accuracy']")
    # Partly trained: some errors, so every metric can be wrong.
    trainer = trainer_with_trained_weights(config, replicas, 60)
    evaluation = trainer.evaluate()
    rows = tfds.as_numpy(trainer.builder.as_dataset(split="test", batch_size=-1))
    logits = trainer.model(trainer.task.preprocess(rows["features"]), training=False).numpy().astype(np.float64)
    expected = _binary_numpy_metrics(logits, rows["label"])
    assert 0.5 < expected["accuracy"] < 1.0 and 0 < expected["precision"] < 1  # Not trivially perfect.
    for name in ("accuracy", "precision", "recall"):  # Ratios of integer counts over 114 rows: exact.
        assert evaluation[name] == pytest.approx(expected[name], abs=1e-6), name
    assert evaluation["top_1_accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
    assert evaluation["loss"] == pytest.approx(expected["loss"], rel=1e-4)
    assert evaluation["auc"] == pytest.approx(expected["auc"], abs=3e-3)  # Keras: 1,000 thresholds.


@pytest.mark.parametrize("replicas", [1, 3])
def test_regression_metrics_equal_numpy_over_the_whole_split(data_dir, replicas):
    config = shipped_config(REGRESSION, "GLOBAL_BATCH_SIZE=48", "experiment.eval_batch_size=48",
                            "STRATEGY='mirrored'", f"VIRTUAL_DEVICES={replicas}")
    trainer = trainer_with_trained_weights(config, replicas, 50)
    evaluation = trainer.evaluate()
    rows = tfds.as_numpy(trainer.builder.as_dataset(split="test", batch_size=-1))
    predictions = trainer.model(trainer.task.preprocess(rows["features"]), training=False).numpy()[:, 0]
    errors = predictions.astype(np.float64) - rows["target"]
    assert len(errors) == 1000 and 1000 % 48  # A padded last batch.
    assert evaluation["mean_absolute_error"] == pytest.approx(np.abs(errors).mean(), rel=1e-5)
    assert evaluation["mean_squared_error"] == pytest.approx(np.square(errors).mean(), rel=1e-5)
    assert evaluation["loss"] == pytest.approx(np.square(errors).mean(), rel=1e-5)


@pytest.mark.parametrize("dataset, metrics, message", [
    ("synthetic_housing", "['accuracy']", "needs a classification task"),
    ("digits", "['auc']", "is for two classes"),
    ("digits", "['top_11_accuracy']", "between 1 and the 10 classes"),
    ("digits", "['f1']", "Unknown metric 'f1'"),
    ("digits", "['accuracy', 'loss']", "'loss' is always reported; do not list it in experiment.metrics"),
])
def test_a_metric_that_does_not_fit_the_task_is_a_config_error(data_dir, dataset, metrics, message):
    config = shipped_config("configs/experiments/digits_mlp.gin", f"DATASET='{dataset}'",
                            f"experiment.metrics={metrics}")
    with pytest.raises(ConfigError, match=message):
        Trainer(config, make_strategy("default"))


@pytest.mark.parametrize("dataset, augment", [("digits", False), ("digits", True), ("breast_cancer", False),
                                              ("synthetic_housing", False), ("synthetic_reviews", False)])
def test_each_tasks_batch_preparation_equals_its_per_example_preparation(dataset, augment, data_dir):
    """Training prepares whole batches (Task.prepare_batch) for speed; evaluation and serving prepare one example at
    a time (Task.prepare). They must agree exactly, or a model is trained on other inputs than it is scored on.
    `augment`: digits with a random crop/flip keyed by per-example seeds (CIFAR-10's augmentation on 8x8 images)."""
    import dataclasses

    from data import builders, registry
    from tasks.augmentation.flip_and_crop import flip_and_crop

    spec = registry.DATASETS[dataset]
    if augment:
        spec = dataclasses.replace(spec, task=dataclasses.replace(spec.task, augment=flip_and_crop))
    builder = builders.load_builder(spec, data_dir)
    spec = registry.bind_task(spec, builder, dataset=dataset)
    features = builder.info.features
    examples = next(iter(builders.encoded_split(spec, builder, spec.train_split).batch(64)))
    seeds = tf.random.stateless_uniform([64, 2], seed=[1, 2], minval=0, maxval=2 ** 31 - 1, dtype=tf.int32)
    inputs, targets = spec.task.prepare_batch(examples, features, seeds=seeds)
    for index in range(64):
        example = {key: value[index] for key, value in examples.items()}
        one_input, one_target = spec.task.prepare(example, features, seed=seeds[index])
        np.testing.assert_array_equal(inputs[index].numpy(), one_input.numpy(), err_msg=f"example {index}")
        np.testing.assert_array_equal(targets[index].numpy(), one_target.numpy())
    if augment:  # Control: the augmentation depends on the seed, so a mix-up of seeds would show.
        shuffled, _ = spec.task.prepare_batch(examples, features, seeds=tf.reverse(seeds, [0]))
        assert not np.array_equal(shuffled.numpy(), inputs.numpy())
