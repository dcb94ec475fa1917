"""MODEL='keras_application' (models/keras_applications.py): a keras.applications backbone by name, weights from a
file and never downloaded, the task's pixels brought back to the range the application's weights expect.

No test downloads: a "pretrained" file is a backbone with random weights saved with save_weights. The TPU config is
checked by tests/test_preflight.py (it runs every configs/tpu/*.gin); the replica-invariance case is
"digits-mobilenet-v3-small" in tests/test_replica_invariance.py.
"""

import json
import logging
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from common.errors import ConfigError
from helpers import REPO_ROOT, run_train_py
from models.keras_applications import APPLICATIONS, ApplicationInput, _input_transform, keras_application

CONFIG = "configs/experiments/digits_mobilenet_v3_small.gin"
DIGITS = dict(input_shape=(8, 8, 1), num_classes=10)
SMALL = dict(input_size=(32, 32), pixel_mean=(0.3,), pixel_std=(0.38,))
SHORT = ["--gin_param=TRAIN_STEPS=20", "--gin_param=STEPS_PER_LOOP=10", "--gin_param=EVAL_EVERY=0",
         "--gin_param=CHECKPOINT_EVERY=20", "--gin_param=GLOBAL_BATCH_SIZE=16", "--gin_param=cosine.warmup_steps=2"]


def _backbone(model: keras.Model) -> keras.Model:
    (backbone,) = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    return backbone


def _random_backbone(name="MobileNetV3Small", seed=7) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return getattr(keras.applications, name)(input_shape=(32, 32, 3), include_top=False, weights=None,
                                             **APPLICATIONS[name][1])


def test_builds_by_name_with_a_resized_backbone_and_float32_logits():
    model = keras_application(**DIGITS, **SMALL)
    assert model.output_shape == (None, 10) and model.output.dtype == "float32"
    assert _backbone(model).name == "MobileNetV3Small" and _backbone(model).input_shape == (None, 32, 32, 3)
    assert model.get_layer("resize").output.shape == (None, 32, 32, 3)  # Static, for TPUs.
    resnet = keras_application((32, 32, 3), 5, name="ResNet50", input_size=(32, 32))
    assert _backbone(resnet).name == "resnet50" and resnet.output_shape == (None, 5)
    assert "resize" not in [layer.name for layer in resnet.layers]  # Already the right size.


def test_an_unknown_name_is_a_config_error_listing_the_names():
    with pytest.raises(ConfigError) as error:
        keras_application(**DIGITS, name="MobileNetV4", **SMALL)
    assert "keras_application.name='MobileNetV4' is not supported" in str(error.value)
    assert all(name in str(error.value) for name in APPLICATIONS)


@pytest.mark.parametrize("input_range", ["0..255", "-1..1", "caffe"])
def test_the_tasks_standardised_pixels_reach_the_applications_range(input_range):
    """Raw digits pixels 0 and 16 (black, white), standardised as the task does, come out as the range the
    application's ImageNet weights were trained on, to 1e-3 (float32 rounding of 255-scale values)."""
    standardised = (np.array([0.0, 16.0], np.float32) / 16.0 - 0.3) / 0.38
    scale, offset = _input_transform((0.3,), (0.38,), input_range)
    layer = ApplicationInput(scale, offset, reverse_channels=input_range == "caffe")
    out = layer(standardised.reshape(2, 1, 1, 1)).numpy().reshape(2, 3)
    expected = {"0..255": [[0.0] * 3, [255.0] * 3], "-1..1": [[-1.0] * 3, [1.0] * 3],
                "caffe": [[-103.939, -116.779, -123.68], [151.061, 138.221, 131.32]]}[input_range]  # BGR.
    np.testing.assert_allclose(out, expected, atol=1e-3)
    # Negative control: another task's standardisation (mean 0, std 1) does not land in that range.
    wrong = ApplicationInput(*_input_transform((0.0,), (1.0,), input_range))(standardised.reshape(2, 1, 1, 1))
    assert np.abs(wrong.numpy().reshape(2, 3) - np.asarray(expected)).max() > 1.0


def test_the_shipped_configs_undo_their_datasets_standardisation():
    """pixel_mean / pixel_std in each shipped config are its dataset's (data/registry.py), so the model's [0, 255]
    pixels are the real ones."""
    import gin

    from data.registry import get_dataset_spec
    from training import config_files

    for path in (CONFIG, "configs/tpu/cifar10_mobilenet_v3_small_1_chip.gin"):
        config_files.parse([path], [], search_path=REPO_ROOT)
        task = get_dataset_spec(config_files.macro("DATASET")).task
        assert gin.query_parameter("keras_application.pixel_mean") == task.mean, path
        assert gin.query_parameter("keras_application.pixel_std") == task.std, path


def test_weights_from_a_file_load_bit_for_bit_and_the_load_is_confirmed(tmp_path, caplog):
    """Loaded bit for bit, and one line says what came from where: every variable of the backbone, its count and
    values (as INIT_FROM's table does for a warm start). Negative control: no file, no line."""
    caplog.set_level(logging.INFO, logger="models")
    saved = _random_backbone(seed=7)
    path = str(tmp_path / "backbone.weights.h5")
    saved.save_weights(path)
    keras.utils.set_random_seed(8)  # Another seed: the fresh backbone's initial weights differ.
    loaded = _backbone(keras_application(**DIGITS, **SMALL, weights_path=path)).get_weights()
    assert len(loaded) == len(saved.get_weights()) > 100
    assert all(np.array_equal(a, b) for a, b in zip(loaded, saved.get_weights(), strict=True))
    values = sum(weight.size for weight in loaded)
    assert [record.getMessage() for record in caplog.records if "weights_path" in record.getMessage()] == [
        f"keras_application.weights_path: loaded the {len(loaded)} variables ({values:,} values) of the "
        f"MobileNetV3Small backbone from {path}."]
    # Negative control: without the file, the same build does not hold the saved weights, and says nothing of them.
    caplog.clear()
    keras.utils.set_random_seed(8)
    fresh = _backbone(keras_application(**DIGITS, **SMALL)).get_weights()
    assert not all(np.array_equal(a, b) for a, b in zip(fresh, saved.get_weights(), strict=True))
    assert "weights_path" not in caplog.text


def test_weights_from_gs_load_too(tmp_path, gcs_bucket):
    saved = _random_backbone(seed=3)
    saved.save_weights(str(tmp_path / "b.weights.h5"))
    path = f"gs://{gcs_bucket}/weights/b.weights.h5"
    tf.io.gfile.makedirs(os.path.dirname(path))
    tf.io.gfile.copy(str(tmp_path / "b.weights.h5"), path)
    loaded = _backbone(keras_application(**DIGITS, **SMALL, weights_path=path)).get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(loaded, saved.get_weights(), strict=True))


@pytest.mark.parametrize("problem", ["other_application", "missing", "suffix"])
def test_a_weights_file_that_does_not_fit_is_a_config_error_naming_it(tmp_path, problem):
    path = str(tmp_path / {"suffix": "backbone.ckpt"}.get(problem, "backbone.weights.h5"))
    if problem == "other_application":
        _random_backbone("MobileNetV2").save_weights(path)
    with pytest.raises(ConfigError) as error:
        keras_application(**DIGITS, **SMALL, weights_path=path)
    assert f"keras_application.weights_path={path!r}" in str(error.value)
    expected = {"other_application": "does not fit the MobileNetV3Small backbone", "missing": "no such file",
                "suffix": "ending in .weights.h5"}[problem]
    assert expected in str(error.value)


@pytest.mark.slow
def test_trains_through_train_py_from_a_weights_file_and_a_mismatch_is_exit_2(tmp_path, data_dir):
    path = str(tmp_path / "backbone.weights.h5")
    _random_backbone().save_weights(path)
    run = run_train_py(f"--gin_file={CONFIG}", *SHORT, f"--gin_param=keras_application.weights_path='{path}'",
                       f"--model_dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "keras_application.weights_path: loaded the 206 variables (939,120 values) of the MobileNetV3Small " \
        f"backbone from {path}." in run.stdout  # Confirmed on the run's output (the backbone at 32x32).
    metrics = json.load(open(tmp_path / "run" / "metrics.json"))
    assert metrics["step"] == 20 and np.isfinite(metrics["train"]["loss"]) and metrics["eval"]["loss"] > 0
    other = str(tmp_path / "mobilenet_v2.weights.h5")
    _random_backbone("MobileNetV2").save_weights(other)
    refused = run_train_py(f"--gin_file={CONFIG}", *SHORT, f"--gin_param=keras_application.weights_path='{other}'",
                           f"--model_dir={tmp_path / 'refused'}")
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    error = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and other in error[0] and "MobileNetV3Small" in error[0], refused.stderr[-3000:]
    assert not os.path.exists(tmp_path / "refused" / "checkpoints")


@pytest.mark.slow
def test_an_unknown_name_through_train_py_is_exit_2_listing_the_names(tmp_path, data_dir):
    result = run_train_py(f"--gin_file={CONFIG}", "--gin_param=keras_application.name='VGG16'",
                          f"--model_dir={tmp_path}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "keras_application.name='VGG16' is not supported; use one of " + ", ".join(APPLICATIONS) in result.stderr


@pytest.mark.slow
def test_a_warm_start_from_a_whole_models_weights_file_restores_it(tmp_path, data_dir):
    """INIT_FROM takes a .weights.h5 of the whole model (backbone and head), found by structure. A backbone-only
    file is keras_application.weights_path's job; INIT_FROM finds nothing of it and says so (exit 2)."""
    keras.utils.set_random_seed(11)
    source = keras_application(**DIGITS, **SMALL)
    whole = str(tmp_path / "whole.weights.h5")
    source.save_weights(whole)
    run = run_train_py(f"--gin_file={CONFIG}", *SHORT, "--gin_param=TRAIN_STEPS=10", "--gin_param=CHECKPOINT_EVERY=10",
                       f"--gin_param=INIT_FROM='{whole}'", f"--model_dir={tmp_path / 'warm'}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    counts = re.search(r"^\s+(\d+) restored$", run.stdout + run.stderr, re.MULTILINE)  # The table's last line.
    assert counts and int(counts.group(1)) == len(source.variables), (run.stdout + run.stderr)[-3000:]
    backbone_only = str(tmp_path / "backbone.weights.h5")
    _backbone(source).save_weights(backbone_only)
    refused = run_train_py(f"--gin_file={CONFIG}", *SHORT, f"--gin_param=INIT_FROM='{backbone_only}'",
                           f"--model_dir={tmp_path / 'refused'}")
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert "no variable of the model was restored" in refused.stderr

