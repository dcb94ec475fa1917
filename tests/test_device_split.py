"""The train split kept on the devices (data/device_split.py) gives the tf.data pipeline's batches bit for bit, and
training from it ends with the same weights; 'auto' uses it only where it can; 'always' says why it cannot.

Resume and replica invariance from the split on the devices are covered where they are for every run: digits
configs use it by default (test_resume_and_export.py, test_replica_invariance.py, test_checkpoint_integrity.py).
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from common.errors import ConfigError
from data import builders, device_split, pipeline
from data.registry import get_dataset_spec
from tasks.augmentation.flip_and_crop import flip_and_crop
from tpu_utils.strategy import make_strategy
from training.trainer import Trainer

GLOBAL_BATCH = 48  # 1,437 digits: step 29 crosses into the second epoch.


def _augmented_digits(data_dir):
    spec = get_dataset_spec("digits")
    spec = dataclasses.replace(spec, task=dataclasses.replace(spec.task, augment=flip_and_crop))
    return spec, builders.load_builder(spec, data_dir)


def _arrays(per_replica, strategy) -> list:
    return [tuple(tensor.numpy() for tensor in replica) for replica in strategy.experimental_local_results(per_replica)]


@pytest.mark.parametrize("replicas", [1, 3])
def test_device_batches_equal_the_tf_data_batches_bit_for_bit(data_dir, replicas):
    """Every replica's (features, labels, positions) of 35 steps, augmentation on, across an epoch boundary,
    started at step 0 and at step 20 (a resume)."""
    spec, builder = _augmented_digits(data_dir)
    strategy = make_strategy("mirrored", virtual_devices=replicas) if replicas > 1 else make_strategy("default")
    split = device_split.DeviceSplit(spec, builder, strategy, global_batch_size=GLOBAL_BATCH, seed=7)
    draw = tf.function(lambda step: strategy.run(split.replica_batch, args=(step,)))
    for start in (0, 20):
        input_fn = pipeline.make_train_input_fn(spec, builder, global_batch_size=GLOBAL_BATCH, seed=7,
                                                start_step=start)
        iterator = iter(strategy.distribute_datasets_from_function(input_fn))
        for step in range(start, 35):
            on_device, from_tf_data = _arrays(draw(tf.constant(step, tf.int64)), strategy), _arrays(next(iterator),
                                                                                                    strategy)
            assert len(on_device) == len(from_tf_data) == replicas
            for device_arrays, data_arrays in zip(on_device, from_tf_data, strict=True):
                for device_array, data_array in zip(device_arrays, data_arrays, strict=True):
                    np.testing.assert_array_equal(device_array, data_array, err_msg=f"step {step}")
            positions = np.concatenate([arrays[2] for arrays in on_device])
            np.testing.assert_array_equal(positions, np.arange(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))


def test_augmentation_changes_the_drawn_images(data_dir):
    """Negative control for the test above: its augmentation does change the batches, so it was compared."""
    spec, builder = _augmented_digits(data_dir)
    plain_spec = get_dataset_spec("digits")
    strategy = make_strategy("default")
    batches = []
    for current in (spec, plain_spec):
        split = device_split.DeviceSplit(current, builder, strategy, global_batch_size=GLOBAL_BATCH, seed=7)
        batches.append(_arrays(tf.function(lambda step, split=split: strategy.run(
            split.replica_batch, args=(step,)))(tf.constant(3, tf.int64)), strategy)[0][0])
    assert not np.array_equal(*batches)


def _trained_weights(small_config, setting: str, *, seed: int = 0) -> list:
    config = small_config(model="cnn", strategy="mirrored", virtual_devices=2, global_batch_size=GLOBAL_BATCH,
                          train_data_on_device=setting, seed=seed, learning_rate=0.05)
    trainer = Trainer(config, make_strategy("mirrored", virtual_devices=2))
    assert trainer.train_data_on_device == (setting == "always")
    iterator = trainer.train_iterator()
    for _ in range(4):  # 60 steps: into the second epoch; the CNN has dropout, keyed by each example's position.
        trainer.train(iterator, 15)
    return [variable.numpy() for variable in trainer.model.variables + trainer.optimizer.variables]


def test_training_from_the_device_split_equals_training_from_tf_data(small_config):
    """2 replicas, 60 steps at the shipped digits learning rate: every weight and slot equal, tolerance 0."""
    on_device, from_tf_data = _trained_weights(small_config, "always"), _trained_weights(small_config, "never")
    for device_value, data_value in zip(on_device, from_tf_data, strict=True):
        np.testing.assert_array_equal(device_value, data_value)
    other_seed = _trained_weights(small_config, "always", seed=1)  # Negative control: other data, other weights.
    assert any(not np.array_equal(a, b) for a, b in zip(on_device, other_seed, strict=True))


def test_auto_keeps_numeric_in_memory_splits_on_the_device_and_says_why_not_otherwise(data_dir):
    digits = get_dataset_spec("digits")
    builder = builders.load_builder(digits, data_dir)
    assert device_split.wanted("auto", digits, builder, on_tpu=False, multi_worker=False)
    assert not device_split.wanted("never", digits, builder, on_tpu=False, multi_worker=False)
    # Several workers: each would receive every other worker's copy at start; 'always' still may.
    assert not device_split.wanted("auto", digits, builder, on_tpu=False, multi_worker=True)
    assert device_split.wanted("always", digits, builder, on_tpu=False, multi_worker=True)
    by_shard = dataclasses.replace(digits, read_by_shard=True)
    assert "read by shard file" in device_split.unusable_because(by_shard, builder, on_tpu=False)
    assert not device_split.wanted("auto", by_shard, builder, on_tpu=False, multi_worker=False)
    with pytest.raises(ConfigError, match=r"train_data_on_device='always' cannot be honoured .* read by shard file"):
        device_split.wanted("always", by_shard, builder, on_tpu=False, multi_worker=False)


def test_tpu_runs_keep_a_split_that_fits_beside_the_model(data_dir, small_config):
    """A TPU config (checked on CPU by --preflight, which builds its Trainer on this CPU) keeps the digits on the
    device; a model whose state (twice over) and the split fill more than half the smallest TPU replica's memory
    keeps them on the host, and 'always' then says why."""
    digits = get_dataset_spec("digits")
    builder = builders.load_builder(digits, data_dir)
    assert device_split.unusable_because(digits, builder, on_tpu=True, state=1 << 20) is None
    assert device_split.wanted("auto", digits, builder, on_tpu=True, multi_worker=False)
    assert Trainer(small_config(strategy="tpu"), make_strategy("default")).train_data_on_device
    large = 2 << 30  # A model and optimizer of 2 GiB: 4 GiB twice over, plus the split, over half of 8 GiB.
    reason = device_split.unusable_because(digits, builder, on_tpu=True, state=large)
    assert reason and "twice the model's state (2,048 MiB)" in reason and "8,192 MiB" in reason, reason
    assert device_split.unusable_because(digits, builder, on_tpu=False, state=large) is None  # Host memory.
    assert not device_split.wanted("auto", digits, builder, on_tpu=True, multi_worker=False, state=large)
    with pytest.raises(ConfigError, match=r"'always' cannot be honoured .* twice the model's state"):
        device_split.wanted("always", digits, builder, on_tpu=True, multi_worker=False, state=large)


def test_the_draw_and_the_whole_loop_compile_with_xla_and_draw_the_same_batches(data_dir, small_config):
    """What a TPU runs, here on the CPU: the draw of steps around an epoch boundary (augmentation on) compiled with
    XLA gives the host's examples, labels and positions bit for bit, and their pixels to float32 rounding (XLA fuses
    the scaling's multiply and subtract into one rounding; a different example or crop would differ by ~1); the
    training loop with the draw inside, compiled whole with XLA, trains like the loop without XLA (loss to 1e-5
    relative, weights of ~0.05 to 1e-5; the negative control, another SEED, is off by far more)."""
    spec, builder = _augmented_digits(data_dir)
    split = device_split.DeviceSplit(spec, builder, make_strategy("default"), global_batch_size=GLOBAL_BATCH, seed=7)
    host, compiled = tf.function(split.replica_batch), tf.function(split.replica_batch, jit_compile=True)
    for step in (0, 28, 29, 30, 10 ** 9):
        step = tf.constant(step, tf.int64)
        (xla_pixels, *xla_rest), (pixels, *rest) = compiled(step), host(step)
        np.testing.assert_allclose(xla_pixels, pixels, rtol=1e-6, atol=1e-6)
        for xla_array, host_array in zip(xla_rest, rest, strict=True):
            np.testing.assert_array_equal(xla_array, host_array)

    def train(*, xla: bool, seed: int = 0):
        trainer = Trainer(small_config(strategy="tpu", model="cnn", global_batch_size=GLOBAL_BATCH, seed=seed),
                          make_strategy("default"))
        assert trainer.train_data_on_device
        if xla:
            trainer._train_loop = tf.function(trainer._train_loop.python_function, jit_compile=True)
        means = trainer.train(trainer.train_iterator(), 40)  # Into the second epoch at step 30.
        return means["loss"], np.concatenate([variable.numpy().ravel() for variable in trainer.model.variables])

    (loss, weights), (xla_loss, xla_weights) = train(xla=False), train(xla=True)
    np.testing.assert_allclose(xla_loss, loss, rtol=1e-5)
    np.testing.assert_allclose(xla_weights, weights, rtol=0, atol=1e-5)  # Measured: 1.4e-6 at worst.
    other_loss, other_weights = train(xla=False, seed=1)  # Without XLA: what it shows needs no third compile.
    assert abs(other_loss - loss) > 1e-3 * abs(loss) and np.abs(other_weights - weights).max() > 1e-2


def test_text_kept_as_strings_stays_on_the_host(data_dir):
    from data.registry import bind_task

    spec = get_dataset_spec("synthetic_reviews")
    builder = builders.load_builder(spec, data_dir)
    spec = bind_task(spec, builder, dataset="synthetic_reviews")
    reason = device_split.unusable_because(spec, builder, on_tpu=False)
    assert reason and "strings" in reason, reason


def test_a_bad_setting_is_a_config_error_naming_the_choices(small_config):
    with pytest.raises(ConfigError, match=r"train_data_on_device='yes' is not one of 'auto', 'always', 'never'"):
        small_config(train_data_on_device="yes")
