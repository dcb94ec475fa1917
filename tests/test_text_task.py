"""The text example (tasks/text_classification.py, models/transformer.py, data/text): raw strings tokenised in the
graph to fixed-length ids, a small Transformer, and every guarantee of the template.

It trains offline through train.py to what its config header states and its SavedModel serves raw strings with
class names; its eval metrics equal a NumPy computation over the whole test split at 1 and 3 replicas (a padded last
batch); a run with dropout resumes bit for bit; `--preflight` passes at 8 replicas in bfloat16. Its float64
replica-invariance check at 1, 2 and 4 replicas (dropout on) is a case of tests/test_replica_invariance.py.
Negative controls: without the attention's padding mask the model's output depends on the padding, and a task that
does not pad to a fixed length fails the preflight.
"""

import dataclasses
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from data import registry as data_registry
from helpers import REPO_ROOT, checkpoint_values, run_train_py, shipped_config, trainer_with_trained_weights
from models import transformer as transformer_module
from tasks.text_classification import TextClassification
from tpu_utils.strategy import make_strategy
from training import preflight
from training.trainer import Trainer

CONFIG = "configs/experiments/synthetic_reviews_transformer.gin"
STATED_ACCURACY = 0.90  # The header measures 95.6% (5% label noise); this is the bound it promises.


def _shipped(*params: str):
    return shipped_config(CONFIG, *params)


def _split(trainer: Trainer, split: str) -> dict:
    return tfds.as_numpy(trainer.builder.as_dataset(split=split, batch_size=-1))


def _python_token_ids(text: str, vocabulary: tuple[str, ...], length: int) -> list[int]:
    """The tokenisation the task documents, in plain Python: what the graph must compute."""
    ids = {word: index + 2 for index, word in enumerate(vocabulary)}
    tokens = [ids.get(word, 1) for word in re.sub(r"[^a-z0-9']+", " ", text.lower()).split()][:length]
    return tokens + [0] * (length - len(tokens))


@pytest.fixture
def trainer(data_dir):
    return Trainer(_shipped(), make_strategy("default"), training=False)


def test_tokenisation_in_the_graph_equals_python_on_every_review_and_odd_strings(trainer):
    task = trainer.task
    assert task.vocabulary[:2] == ("the", "is") and len(set(task.vocabulary)) == len(task.vocabulary)
    assert trainer.model.get_layer("token_embedding").input_dim == task.vocabulary_size  # From model_options().
    texts = [text.decode() for text in _split(trainer, "test")["text"]]
    texts += ["", "  ", "UNKNOWN zebra words!", "The BATTERY, is... not good", "don't " * 40, "the " * 31 + "battery"]
    got = task.tokenize(tf.constant(texts)).numpy()
    assert got.shape == (len(texts), task.sequence_length) and got.dtype == np.int32
    expected = [_python_token_ids(text, task.vocabulary, task.sequence_length) for text in texts]
    np.testing.assert_array_equal(got, np.array(expected))
    assert (got[-4] == 1).sum() == 3 and got[-1][-1] != 0  # Unknown words are OOV (1); 32 words fill every slot.


def test_the_vocabulary_is_counted_on_the_train_split_the_same_way_every_time(trainer):
    again = data_registry.get_dataset_spec("synthetic_reviews").task.bind(trainer.builder)
    assert again.vocabulary == trainer.task.vocabulary
    small = TextClassification(max_tokens=12).bind(trainer.builder)
    assert small.vocabulary == trainer.task.vocabulary[:10] and small.vocabulary_size == 12
    with pytest.raises(ValueError, match="max_tokens=2 is too small"):
        TextClassification(max_tokens=2)
    with pytest.raises(ValueError, match="more than max_tokens - 2 = 1"):
        TextClassification(max_tokens=3, vocabulary=("a", "b")).model_options()


@pytest.mark.slow
def test_the_example_reaches_its_stated_accuracy_and_serves_raw_strings(tmp_path, data_dir):
    model_dir = str(tmp_path / "run")
    result = run_train_py(f"--gin_file={CONFIG}", f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.load(open(os.path.join(model_dir, "metrics.json")))
    assert metrics["eval"]["accuracy"] >= STATED_ACCURACY, metrics
    header = open(os.path.join(REPO_ROOT, CONFIG)).read()
    assert f"asserts >= {STATED_ACCURACY:.0%}" in header  # The header states the bound this test holds.

    config = _shipped()
    trainer = Trainer(config, make_strategy("default"), training=False)
    reviews = _split(trainer, "test")
    served = tf.saved_model.load(os.path.join(model_dir, "export", str(config.train_steps)))
    outputs = served.signatures["serving_default"](text=tf.constant(reviews["text"][:64]))
    names = [name.decode() for name in outputs["class_names"].numpy()]
    assert set(names) <= {"negative", "positive"}
    assert np.mean(outputs["classes"].numpy() == reviews["label"][:64]) >= 0.85  # Noisy labels among them.
    np.testing.assert_allclose(outputs["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)
    # Raw strings the dataset never held: case, punctuation, negation, contrast; served the same way.
    outputs = served.signatures["serving_default"](text=tf.constant(["THE SCREEN IS GREAT!!", "the screen is not great",
                                                                     "The price is awful, but the lens is superb."]))
    assert [name.decode() for name in outputs["class_names"].numpy()] == ["positive", "negative", "positive"]


@pytest.mark.parametrize("replicas", [1, 3])
def test_eval_metrics_equal_numpy_over_the_whole_split(data_dir, replicas):
    """1,000 test reviews, eval batch 48 (16 per replica at 3): the last batch holds 40 reviews and 8 all-padding
    sequences, which count in nothing."""
    config = _shipped("GLOBAL_BATCH_SIZE=48", "experiment.eval_batch_size=48", "STRATEGY='mirrored'",
                      f"VIRTUAL_DEVICES={replicas}")
    # Barely trained: many errors, so the metrics can be wrong.
    trainer = trainer_with_trained_weights(config, replicas, 40)
    evaluation = trainer.evaluate()
    reviews = _split(trainer, "test")
    logits = trainer.model(trainer.task.tokenize(tf.constant(reviews["text"])), training=False).numpy()
    logits = logits.astype(np.float64)
    labels = reviews["label"]
    assert len(labels) == 1000 and 1000 % 48
    log_probabilities = logits - logits.max(axis=1, keepdims=True)
    log_probabilities -= np.log(np.exp(log_probabilities).sum(axis=1, keepdims=True))
    accuracy = float(np.mean(np.argmax(logits, axis=1) == labels))
    assert 0.3 < accuracy < 1.0 and len(set(np.argmax(logits, axis=1))) == 2  # Both classes predicted.
    assert evaluation["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert evaluation["loss"] == pytest.approx(-log_probabilities[np.arange(1000), labels].mean(), rel=1e-4)


def _logits_at_two_lengths(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Logits of one Transformer's weights at sequence lengths 16 and 48 (the longer position table starts with
    the shorter one), so only the amount of padding differs."""
    vocabulary = ("the", "screen", "is", "not", "great", "but", "bad")
    logits = []
    for length in (16, 48):
        task = TextClassification(sequence_length=length, vocabulary=vocabulary)
        model = transformer_module.transformer((length,), 2, vocab_size=task.vocabulary_size, num_blocks=2)
        if length == 16:
            weights = model.get_weights()
        else:
            positions = model.get_layer("position_embedding").embeddings
            model.set_weights([np.tile(value, (3, 1)) if value.shape == (16, positions.shape[1]) else value
                               for value in weights])
        logits.append(model(task.tokenize(tf.constant(texts)), training=False).numpy())
    return logits[0], logits[1]


TEXTS = ["the screen is great", "the screen is not great but the screen is bad", ""]


def test_padding_is_invisible_to_the_transformer():
    short, long = _logits_at_two_lengths(TEXTS)
    np.testing.assert_allclose(short, long, rtol=1e-5, atol=1e-6)
    assert np.isfinite(long).all()  # The empty (all-padding) text too: the eval pipeline pads batches with it.


def test_negative_control_without_the_padding_mask_padding_changes_the_output(monkeypatch):
    real_call = transformer_module.EncoderBlock.call
    monkeypatch.setattr(transformer_module.EncoderBlock, "call",
                        lambda self, x, mask, training=False: real_call(self, x, tf.ones_like(mask), training))
    short, long = _logits_at_two_lengths(TEXTS)
    assert np.abs(short[:2] - long[:2]).max() > 1e-3


def test_the_transformer_trains_in_mixed_bfloat16_with_float32_logits(data_dir):
    trainer = Trainer(_shipped("PRECISION='mixed_bfloat16'"), make_strategy("default"))
    assert trainer.model.get_layer("token_embedding").compute_dtype == "bfloat16"
    assert trainer.model.outputs[0].dtype == "float32" and all(w.dtype == "float32" for w in trainer.model.weights)
    losses = [trainer.train(trainer.train_iterator(), 50)["loss"] for _ in range(2)]
    assert np.isfinite(losses).all() and losses[1] < losses[0], losses


COMMON = [f"--gin_file={CONFIG}", "--gin_param=transformer.dropout_rate=0.3", "--gin_param=STRATEGY='mirrored'",
          "--gin_param=VIRTUAL_DEVICES=2", "--gin_param=STEPS_PER_LOOP=10", "--gin_param=CHECKPOINT_EVERY=10",
          "--gin_param=EVAL_EVERY=0", "--gin_param=experiment.lr_schedule='constant'"]


@pytest.mark.slow
def test_a_run_with_dropout_on_two_replicas_resumes_exactly(tmp_path, data_dir):
    interrupted, straight = str(tmp_path / "interrupted"), str(tmp_path / "straight")
    full = run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=40", f"--model_dir={straight}")
    assert full.returncode == 0, full.stderr[-3000:]
    first = run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=20", f"--model_dir={interrupted}")
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=40", f"--model_dir={interrupted}")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "at step 20" in second.stdout
    resumed, uninterrupted = checkpoint_values(interrupted), checkpoint_values(straight)
    assert resumed.keys() == uninterrupted.keys()
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)


@pytest.mark.slow
def test_preflight_passes_at_8_replicas_in_bfloat16(tmp_path, data_dir):
    result = run_train_py(f"--gin_file={CONFIG}", "--preflight", "--gin_param=experiment.target_replicas=8",
                          "--gin_param=PRECISION='mixed_bfloat16'", f"--model_dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "preflight passed." in result.stdout
    for check in ("train step compiles with XLA", "static per-replica input shapes"):
        assert f"ok   {check}" in result.stdout, result.stdout
    assert "train (8, 32)" in result.stdout  # 8 reviews of 32 token ids per replica.


class _Unpadded(TextClassification):
    """A text task that forgets to pad: each example keeps its own number of ids."""

    def prepare(self, example, features, *, seed=None):
        words = tf.strings.split(example[self.text_key])
        return tf.ones_like(words, tf.int32), example[self.label_key]


def test_negative_control_a_task_without_fixed_length_fails_the_preflight(data_dir, tmp_path, monkeypatch):
    spec = data_registry.get_dataset_spec("synthetic_reviews")
    unpadded = _Unpadded(**{field: getattr(spec.task, field) for field in ("num_classes", "sequence_length")})
    monkeypatch.setitem(data_registry.DATASETS, "synthetic_reviews",
                        dataclasses.replace(spec, task=unpadded))
    checks = preflight.run_preflight(_shipped("experiment.target_replicas=8"), str(tmp_path))
    problems = {check.name: check.problem for check in checks if check.problem}
    assert list(problems) == ["input pipelines and model build"], problems
    assert "prepares examples of shape (None,)" in problems["input pipelines and model build"]
    assert "pad or truncate sequences to a fixed length" in problems["input pipelines and model build"]
