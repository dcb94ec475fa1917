"""Evaluation is exact: every example of the eval split once, padding masked out, for any replica count.

The digits test split has 360 examples; an eval batch of 48 leaves a last batch of 24 real + 24 padded examples.
The template's metrics must equal a plain NumPy computation over the whole split: the loss to 1e-4 relative (float32
logits of the same model differ by ~1e-6 between batch shapes), the accuracy as an exact count.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from helpers import trainer_with_trained_weights
from tpu_utils.strategy import make_strategy
from training.trainer import Trainer

EVAL_BATCH = 48


TIE_MARGIN = 1e-4  # Logits this close to the top one may win the argmax in another batch size (float32 rounding).


def _numpy_metrics(trainer: Trainer, chunk: int) -> dict:
    """Loss and correct counts over the whole eval split, from the model's logits in chunks of `chunk` images."""
    spec = trainer.dataset_spec
    examples = tfds.as_numpy(trainer.builder.as_dataset(split=spec.eval_split, batch_size=-1))
    assert examples["label"].shape[0] % EVAL_BATCH != 0, "the split must not be a multiple of the batch"
    images = trainer.task.preprocess(examples["image"])
    logits = np.concatenate([trainer.model(images[start:start + chunk], training=False).numpy()
                             for start in range(0, len(images), chunk)]).astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    log_probabilities = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    labels = examples["label"]
    label_logits = logits[np.arange(len(labels)), labels]
    others = logits.copy()
    others[np.arange(len(labels)), labels] = -np.inf
    best_other = others.max(axis=1)
    losses = -log_probabilities[np.arange(len(labels)), labels]
    return {"loss": float(losses.mean()), "loss_std": float(losses.std()),
            "surely_correct": int((label_logits > best_other + TIE_MARGIN).sum()),
            "possibly_correct": int((label_logits >= best_other - TIE_MARGIN).sum()), "count": len(labels)}


@pytest.mark.parametrize("replicas", [1, 3, 8])
def test_eval_metrics_equal_numpy_over_the_whole_split(small_config, replicas):
    config = small_config(model="cnn", strategy="mirrored", virtual_devices=replicas, eval_batch_size=EVAL_BATCH,
                          global_batch_size=48)
    trainer = trainer_with_trained_weights(config, replicas, 40)  # Partly trained: per-example losses spread out.
    evaluation = trainer.evaluate()
    expected = _numpy_metrics(trainer, chunk=EVAL_BATCH // replicas)
    assert 0.5 * expected["count"] < expected["surely_correct"] < expected["count"]
    # Sensitivity: one example missing or counted twice moves the mean loss by about std / N, well above 1e-4.
    assert expected["loss_std"] / expected["count"] > 5 * 1e-4 * expected["loss"]
    assert evaluation["loss"] == pytest.approx(expected["loss"], rel=1e-4)
    # Accuracy is a count over exactly 360 examples: an integer, between the sure and the near-tie NumPy counts
    # (a dropped, duplicated or unmasked padding example would move it by at least one).
    correct = evaluation["accuracy"] * expected["count"]
    assert correct == pytest.approx(round(correct), abs=1e-3)
    assert expected["surely_correct"] <= round(correct) <= expected["possibly_correct"]
    assert expected["possibly_correct"] - expected["surely_correct"] <= 2


def test_eval_input_covers_each_example_once_and_masks_padding(small_config):
    """The eval dataset for 3 pipelines x 1 replica holds the split once plus masked zero padding."""
    from data import pipeline

    trainer = Trainer(small_config(eval_batch_size=EVAL_BATCH, global_batch_size=48), make_strategy("default"))
    input_fn, num_steps = pipeline.make_eval_input_fn(trainer.dataset_spec, trainer.builder,
                                                      global_batch_size=EVAL_BATCH)
    assert num_steps == 8  # ceil(360 / 48)
    seen_labels, masks = [], []
    for pipeline_id in range(3):
        context = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=3)
        for images, labels, mask in input_fn(context):
            assert images.shape == (16, 8, 8, 1)  # Static per-replica shape, every batch.
            seen_labels.append(labels.numpy()[mask.numpy() == 1])
            masks.append(mask.numpy())
    all_masks = np.concatenate(masks)
    assert all_masks.sum() == 360 and all_masks.size == 384
    expected = tfds.as_numpy(trainer.builder.as_dataset(split="test", batch_size=-1))["label"]
    np.testing.assert_array_equal(np.sort(np.concatenate(seen_labels)), np.sort(expected))


@pytest.mark.slow
def test_a_run_trained_with_batch_64_is_evaluated_on_3_replicas(tmp_path, data_dir):
    """--mode=eval needs only the eval batch to split over the replicas: 64 does not divide by 3, so the eval batch
    becomes 63 (padded and masked as always) and the metrics equal the 1-replica evaluation."""
    import json

    from helpers import run_train_py

    model_dir = str(tmp_path / "run")
    common = ["--gin_param=TRAIN_STEPS=100", f"--model_dir={model_dir}"]  # default.gin: GLOBAL_BATCH_SIZE = 64.
    assert run_train_py(*common).returncode == 0
    trained = json.load(open(tmp_path / "run" / "metrics.json"))["eval"]
    evaluated = run_train_py(*common, "--mode=eval", "--gin_param=STRATEGY='mirrored'",
                             "--gin_param=VIRTUAL_DEVICES=3")
    assert evaluated.returncode == 0, evaluated.stderr
    assert "3 replica(s)" in evaluated.stdout
    on_three = json.load(open(tmp_path / "run" / "metrics.json"))["eval"]
    assert on_three["accuracy"] == pytest.approx(trained["accuracy"], abs=1e-9)  # The same 360 examples.
    assert on_three["loss"] == pytest.approx(trained["loss"], rel=1e-5)
    # Training itself still refuses a batch that does not split.
    refused = run_train_py(*common[1:], "--gin_param=TRAIN_STEPS=200", "--gin_param=STRATEGY='mirrored'",
                           "--gin_param=VIRTUAL_DEVICES=3")
    assert refused.returncode == 2 and "GLOBAL_BATCH_SIZE=64 does not divide by the 3 replicas" in refused.stderr


def test_the_training_loss_is_the_data_loss_and_the_regularization_is_apart(small_config, data_dir):
    """Train and eval 'loss' mean the same thing: the mean per-example loss. With L2 on, the regularization term is
    reported on its own. Checked against NumPy on the first global batch at the initial weights (one step: the loss
    is computed before the update)."""
    import gin

    gin.bind_parameter("mlp.kernel_l2", 1e-2)
    trainer = Trainer(small_config(model="mlp", strategy="mirrored", virtual_devices=4), make_strategy(
        "mirrored", virtual_devices=4))
    kernels = [weight.numpy() for weight in trainer.model.weights if weight.path.endswith("kernel")]
    features, labels, _ = next(iter(trainer.train_input_fn()(tf.distribute.InputContext())))
    logits = trainer.model(features, training=False).numpy().astype(np.float64)  # No dropout, no BN: same math.
    logits -= logits.max(axis=1, keepdims=True)
    log_probabilities = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    expected_loss = -log_probabilities[np.arange(len(labels)), labels.numpy()].mean()
    expected_regularization = sum(1e-2 * np.sum(kernel.astype(np.float64) ** 2) for kernel in kernels)

    metrics = trainer.train(trainer.train_iterator(), 1)
    assert metrics["loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert metrics["regularization"] == pytest.approx(expected_regularization, rel=1e-5)
    assert metrics["regularization"] > 0.01 * metrics["loss"]  # Large enough that mixing them up would show.


def test_eval_mode_whose_record_fails_warns_and_does_not_evaluate_twice(tmp_path, data_dir, monkeypatch, caplog):
    """--mode=eval prints the metrics, then records them; a storage failure while recording is a warning with the
    metrics kept, not a second pass over the eval split (50,000 images on ImageNet). The failure is simulated
    (write_metrics raises the StorageError a full disk gives) to keep it to the recording step."""
    import train
    from common.errors import StorageError
    from training.run_directory.layout import RunDirectory

    args = ["train.py", "--gin_file=configs/experiments/digits_mlp.gin", f"--model_dir={tmp_path}",
            "--gin_param=TRAIN_STEPS=20", "--gin_param=STEPS_PER_LOOP=10", "--gin_param=EVAL_EVERY=10",
            "--gin_param=cosine.warmup_steps=5"]
    assert train.main(args) == 0
    evaluations = []
    real_evaluate = Trainer.evaluate
    monkeypatch.setattr(Trainer, "evaluate", lambda self: evaluations.append(1) or real_evaluate(self))

    def full_disk(self, *args, **kwargs):
        raise StorageError("Writing metrics.json failed (disk full).")

    monkeypatch.setattr(RunDirectory, "write_metrics", full_disk)
    assert train.main([*args, "--mode=eval"]) == 0
    assert evaluations == [1]
    assert "computed but not recorded" in caplog.text
