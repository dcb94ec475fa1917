"""Warm start (INIT_FROM, training/warm_start.py) and freezing (experiment.trainable/frozen,
training/variable_selection.py), on real Trainers and real train.py runs.

The source is a real run of the default CNN (two checkpoints). A warm-started Trainer holds, at step 0, exactly the
source's model variables and a fresh optimizer; a new head (another class count) loads the backbone once its layer
is excluded; a resumed fine-tune continues from its own checkpoint after SIGKILL; the refusals exit 2.
"""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from common.errors import ConfigError
from helpers import REPO_ROOT, checkpoint_values, run_train_py
from tpu_utils.strategy import make_strategy
from training.trainer import Trainer

SOURCE_ARGS = ["--gin_param=TRAIN_STEPS=20", "--gin_param=STEPS_PER_LOOP=10", "--gin_param=CHECKPOINT_EVERY=10",
               "--gin_param=EVAL_EVERY=0", "--gin_param=cosine.warmup_steps=5"]
FINE_TUNE = ["--gin_param=STEPS_PER_LOOP=10", "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=0",
             "--gin_param=LEARNING_RATE=0.01", "--gin_param=experiment.lr_schedule='constant'"]


@pytest.fixture(scope="module")
def source(tmp_path_factory, data_dir) -> str:
    """model_dir of a 20-step default-CNN run with checkpoints at steps 10 and 20."""
    model_dir = str(tmp_path_factory.mktemp("source") / "run")
    result = run_train_py(*SOURCE_ARGS, f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-2000:]
    return model_dir


def _values(model) -> list[np.ndarray]:
    return [variable.numpy() for variable in model.variables]


def _restored(small_config, checkpoint: str):
    """A CNN Trainer whose model holds the model variables of `checkpoint`, as TensorFlow's own restore reads them."""
    import tensorflow as tf

    trainer = Trainer(small_config(model="cnn"), make_strategy("default"))
    tf.train.Checkpoint(model=trainer.model).restore(checkpoint).expect_partial().assert_existing_objects_matched()
    return trainer


def _adam_slots(trainer) -> list:
    return [variable for variable in trainer.optimizer.variables if variable.name.endswith(("momentum", "velocity"))]


def test_from_a_run_directory_and_from_a_checkpoint_prefix(source, small_config):
    newest = _values(_restored(small_config, f"{source}/checkpoints/ckpt-20").model)
    older = _values(_restored(small_config, f"{source}/checkpoints/ckpt-10").model)
    for init_from, expected in ((source, newest), (f"{source}/checkpoints/ckpt-10", older)):
        trainer = Trainer(small_config(model="cnn", optimizer="adam", init_from=init_from), make_strategy("default"))
        status = trainer.warm_start()
        assert set(status.values()) == {"restored"} and len(status) == 14
        for got, want in zip(_values(trainer.model), expected, strict=True):
            np.testing.assert_array_equal(got, want)
        # The optimizer state is not the source's (SGD with momentum there): a fresh Adam, nothing applied yet.
        assert int(trainer.optimizer.iterations.numpy()) == 0 and trainer.step == 0
        slots = _adam_slots(trainer)
        assert len(slots) == 2 * 10 and not any(np.any(slot.numpy()) for slot in slots)
    assert any(not np.array_equal(a, b) for a, b in zip(newest, older, strict=True))  # The prefix chose ckpt-10.


def test_from_a_keras_weights_file(source, small_config, tmp_path):
    trainer = _restored(small_config, f"{source}/checkpoints/ckpt-20")
    weights = str(tmp_path / "cnn.weights.h5")
    trainer.model.save_weights(weights)
    warm = Trainer(small_config(model="cnn", init_from=weights), make_strategy("mirrored", virtual_devices=2))
    warm.warm_start()
    for got, want in zip(_values(warm.model), _values(trainer.model), strict=True):
        np.testing.assert_array_equal(got, want)


def _five_class_weights(path: str) -> list[np.ndarray]:
    """Writes a .weights.h5 of the CNN with a 5-class head (random weights); returns its variables' values."""
    import keras

    from models.registry import get_model_builder

    keras.utils.set_random_seed(7)
    model = get_model_builder("cnn")((8, 8, 1), 5)
    model.save_weights(path)
    return _values(model)


def test_a_new_head_loads_the_backbone_and_keeps_its_own_fresh_logits(small_config, tmp_path):
    path = str(tmp_path / "five.weights.h5")
    source = _five_class_weights(path)
    with pytest.raises(ConfigError, match=r"logits/kernel \(source \(128, 5\), model \(128, 10\)\).*init_exclude"):
        Trainer(small_config(model="cnn", init_from=path), make_strategy("default")).warm_start()
    fresh = Trainer(small_config(model="cnn"), make_strategy("default"))
    trainer = Trainer(small_config(model="cnn", init_from=path, init_exclude=("logits",)), make_strategy("default"))
    status = trainer.warm_start()
    assert status["logits/kernel"].startswith("skipped") and list(status.values()).count("restored") == 12
    for variable, fresh_variable, source_value in zip(trainer.model.variables, fresh.model.variables, source,
                                                      strict=True):
        if variable.path.startswith("logits/"):  # The fresh initial values of this SEED, not the source's.
            np.testing.assert_array_equal(variable.numpy(), fresh_variable.numpy())
        else:
            np.testing.assert_array_equal(variable.numpy(), source_value)


def test_shape_mismatch_and_nothing_matched_exit_2_naming_the_variables(source, tmp_path, data_dir):
    path = str(tmp_path / "five.weights.h5")
    _five_class_weights(path)
    mismatch = run_train_py(*FINE_TUNE, "--gin_param=TRAIN_STEPS=10", f"--gin_param=INIT_FROM='{path}'",
                            f"--model_dir={tmp_path / 'mismatch'}")
    assert mismatch.returncode == 2, mismatch.stderr[-2000:]
    assert "logits/kernel (source (128, 5), model (128, 10))" in mismatch.stderr
    assert "experiment.init_exclude=['logits']" in mismatch.stderr
    # An MLP from a CNN run: no variable sits at the same place.
    nothing = run_train_py("--gin_file=configs/experiments/digits_mlp.gin", *FINE_TUNE, "--gin_param=TRAIN_STEPS=10",
                           f"--gin_param=INIT_FROM='{source}'", f"--model_dir={tmp_path / 'nothing'}")
    assert nothing.returncode == 2, nothing.stderr[-2000:]
    assert "no variable of the model was restored" in nothing.stderr and "dense/kernel: skipped" in nothing.stderr
    missing = run_train_py(*FINE_TUNE, "--gin_param=TRAIN_STEPS=10", f"--gin_param=INIT_FROM='{tmp_path}/none'",
                           f"--model_dir={tmp_path / 'missing'}")
    assert missing.returncode == 2 and "is not a run directory with checkpoints/" in missing.stderr
    for run in ("mismatch", "nothing", "missing"):  # Refused before any training step: no checkpoint written.
        assert not os.path.exists(tmp_path / run / "checkpoints" / "checkpoint")


@pytest.mark.slow
def test_a_fine_tune_killed_after_a_checkpoint_resumes_from_its_own_not_from_init_from(source, tmp_path):
    steps, model_dir, straight = 200, str(tmp_path / "tune"), str(tmp_path / "straight")
    args = [*FINE_TUNE, f"--gin_param=TRAIN_STEPS={steps}", f"--gin_param=INIT_FROM='{source}'"]
    process = subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "train.py"), *args, f"--model_dir={model_dir}"],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    try:
        for line in process.stdout:
            log.append(line)
            logged = re.search(rf" step +(\d+)/{steps} \|", line)
            if logged and int(logged.group(1)) >= 60:
                process.kill()
                break
    finally:
        process.kill()
        assert process.wait(timeout=60) == -signal.SIGKILL, "".join(log)[-3000:]
    assert "Warm start from" in "".join(log)
    resumed = run_train_py(*args, f"--model_dir={model_dir}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert re.search(r"Resumed from \S+ at step [1-9]", resumed.stdout + resumed.stderr)
    assert "not used: this run resumes from its own checkpoint" in resumed.stdout + resumed.stderr
    assert "Warm start from" not in resumed.stdout + resumed.stderr
    uninterrupted = run_train_py(*args, f"--model_dir={straight}")
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-2000:]
    got, want = checkpoint_values(model_dir), checkpoint_values(straight)
    assert got.keys() == want.keys()
    for key in want:  # Re-initialising from INIT_FROM on the rerun would have lost the steps before the kill.
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_frozen_variables_stay_bit_identical_while_the_others_train(small_config):
    frozen = ("conv2d*", "batch_normalization*", "dense*/bias")
    trainer = Trainer(small_config(model="cnn", strategy="mirrored", virtual_devices=3, optimizer="adam",
                                   frozen=frozen), make_strategy("mirrored", virtual_devices=3))
    before = {variable.path: variable.numpy() for variable in trainer.model.variables}
    trainer.train(trainer.train_iterator(), 10)
    fixed = [path for path in before if path.split("/")[0].startswith(("conv2d", "batch_normalization"))
             or re.fullmatch(r"dense(_\d+)?/bias", path)]
    assert len(fixed) == 11  # 2 kernels, 2 x 4 BatchNormalization variables (moving statistics too), the bias.
    for variable in trainer.model.variables:
        if variable.path in fixed:
            np.testing.assert_array_equal(variable.numpy(), before[variable.path], err_msg=variable.path)
        else:
            assert not np.array_equal(variable.numpy(), before[variable.path]), variable.path
    # The optimizer built slots only for the 3 trained variables (dense kernel, logits kernel and bias).
    slots = _adam_slots(trainer)
    assert len(trainer.trainable_variables) == 3 and len(slots) == 2 * 3
    # Negative control: without freezing, the same variables change.
    plain = Trainer(small_config(model="cnn"), make_strategy("default"))
    start = {variable.path: variable.numpy() for variable in plain.model.variables}
    plain.train(plain.train_iterator(), 10)
    assert all(not np.array_equal(variable.numpy(), start[variable.path]) for variable in plain.model.variables)


def test_bad_patterns_and_settings_are_refused_before_training(small_config):
    with pytest.raises(ConfigError, match=r"experiment.frozen: the pattern 'conv' matches no variable"):
        Trainer(small_config(model="cnn", frozen=("conv",)), make_strategy("default"))
    with pytest.raises(ConfigError, match="leave no variable to train"):
        Trainer(small_config(model="mlp", frozen=("*",)), make_strategy("default"))
    with pytest.raises(ConfigError, match="INIT_FROM is None"):
        small_config(init_exclude=("logits",))
    with pytest.raises(ConfigError, match=r"experiment.frozen: the pattern 're:\(' is not a regular expression"):
        small_config(frozen=("re:(",))
    with pytest.raises(ConfigError, match=r"a .keras model file is not read; save its weights"):
        small_config(init_from="model.keras")
    assert small_config(frozen=["re:logits/.*"]).frozen == ("re:logits/.*",)  # A gin list, kept as a tuple.
