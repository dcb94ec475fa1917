"""Exact resume through the real command line, and a SavedModel that reproduces the model's predictions elsewhere."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import checkpoint_values, run_train_py

N = 20  # Steps per segment; STEPS_PER_LOOP = 5.
COMMON = ["--gin_param=STRATEGY='mirrored'", "--gin_param=VIRTUAL_DEVICES=2", "--gin_param=STEPS_PER_LOOP=5",
          "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=10", "--gin_param=GLOBAL_BATCH_SIZE=32",
          "--gin_param=experiment.optimizer='adam'", "--gin_param=experiment.lr_schedule='constant'",
          "--gin_param=LEARNING_RATE=0.01"]


@pytest.mark.slow
def test_n_steps_then_resume_then_n_more_equals_2n_uninterrupted(tmp_path, data_dir):
    interrupted, straight = str(tmp_path / "interrupted"), str(tmp_path / "straight")
    first = run_train_py(*COMMON, f"--gin_param=TRAIN_STEPS={N}", f"--model_dir={interrupted}")
    assert first.returncode == 0, first.stderr
    second = run_train_py(*COMMON, f"--gin_param=TRAIN_STEPS={2 * N}", f"--model_dir={interrupted}")
    assert second.returncode == 0, second.stderr
    assert f"at step {N}" in second.stdout  # It resumed instead of starting over.
    third = run_train_py(*COMMON, f"--gin_param=TRAIN_STEPS={2 * N}", f"--model_dir={straight}")
    assert third.returncode == 0, third.stderr

    resumed, uninterrupted = checkpoint_values(interrupted), checkpoint_values(straight)
    assert resumed.keys() == uninterrupted.keys() and len(resumed) > 10  # Model weights and Adam slots.
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)  # Bit for bit on CPU.

    # The run directory docs/run_directory.md promises.
    metrics = json.load(open(os.path.join(straight, "metrics.json")))
    assert metrics["step"] == 2 * N and set(metrics["eval"]) == {"loss", "accuracy"} and "loss" in metrics["train"]
    assert os.path.isfile(os.path.join(straight, "operative_config.gin"))
    assert "TRAIN_STEPS=40" in open(os.path.join(straight, "command.txt")).read()
    assert os.path.isdir(os.path.join(straight, "export", str(2 * N)))
    for folder in ("train", "eval"):
        assert any(name.startswith("events.out.tfevents") for name in os.listdir(os.path.join(straight, folder)))


def test_resuming_with_another_batch_size_is_refused(tmp_path, data_dir):
    model_dir = str(tmp_path / "run")
    assert run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=5", f"--model_dir={model_dir}").returncode == 0
    changed = run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=10", "--gin_param=GLOBAL_BATCH_SIZE=64",
                           f"--model_dir={model_dir}")
    assert changed.returncode == 2
    assert "GLOBAL_BATCH_SIZE: checkpoint 32, now 64" in changed.stderr


@pytest.mark.slow  # ~30 s: a second Python process loads TensorFlow (the point: nothing of this process helps it).
def test_exported_saved_model_reproduces_predictions_in_a_fresh_process(tmp_path, small_config):
    from tpu_utils.strategy import make_strategy
    from training.controller import Controller
    from training.run_directory.layout import RunDirectory
    from training.run_directory.record import RunRecord
    from training.trainer import Trainer

    trainer = Trainer(small_config(model="cnn", train_steps=10), make_strategy("default"))
    controller = Controller(trainer, RunRecord(trainer, RunDirectory(str(tmp_path / "run"))))
    controller.record.restore()
    controller.train_and_evaluate()
    export_dir = str(tmp_path / "run" / "export" / "10")
    images = np.random.RandomState(0).randint(0, 17, size=(50, 8, 8, 1)).astype(np.uint8)
    expected = trainer.model(trainer.task.preprocess(images), training=False).numpy()
    np.save(tmp_path / "images.npy", images)

    script = ("import sys, numpy as np, tensorflow as tf\n"
              "serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
              "out = serve(images=tf.constant(np.load(sys.argv[2])))\n"
              "np.save(sys.argv[3], out['logits'].numpy()); np.save(sys.argv[4], out['classes'].numpy())\n")
    result = subprocess.run([sys.executable, "-c", script, export_dir, str(tmp_path / "images.npy"),
                             str(tmp_path / "logits.npy"), str(tmp_path / "classes.npy")],
                            capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                            env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.load(tmp_path / "classes.npy"), expected.argmax(axis=1))

    # Inputs of the wrong shape are an error for the caller, not a crash of the serving process (a 3-D batch
    # aborted it in the convolution's shape check) nor an answer for a wrong image size (9 x 9 passed pooling).
    bad_shapes = ("import tensorflow as tf\n"
                  f"serve = tf.saved_model.load({export_dir!r}).signatures['serving_default']\n"
                  "for shape in ((2, 8, 8), (2, 9, 9, 1)):\n"
                  "    try:\n"
                  "        serve(images=tf.zeros(shape, tf.uint8))\n"
                  "        print('served', shape)\n"
                  "    except tf.errors.InvalidArgumentError:\n"
                  "        print('refused', shape)\n")
    result = subprocess.run([sys.executable, "-c", bad_shapes], capture_output=True, text=True, timeout=120,
                            cwd=str(tmp_path), env={key: value for key, value in os.environ.items()
                                                    if key != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:2] == ["refused (2, 8, 8)", "refused (2, 9, 9, 1)"], result.stdout


def test_a_resumed_run_uses_the_newly_configured_learning_rate(tmp_path, small_config):
    from tpu_utils.strategy import make_strategy
    from training.controller import Controller
    from training.run_directory.layout import RunDirectory
    from training.run_directory.record import RunRecord
    from training.trainer import Trainer

    first = Trainer(small_config(train_steps=5, learning_rate=0.05), make_strategy("default"))
    Controller(first, RunRecord(first, RunDirectory(str(tmp_path)))).train_and_evaluate()
    resumed = Trainer(small_config(train_steps=10, learning_rate=0.2), make_strategy("default"))
    RunRecord(resumed, RunDirectory(str(tmp_path))).restore()
    assert resumed.step == 5
    assert float(resumed.optimizer.learning_rate.numpy()) == pytest.approx(0.2)
