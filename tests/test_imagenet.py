"""ImageNet: the decoders of data/imagenet.py, staging, and exact resume through train.py, on a fake ImageNet built
by TFDS's real imagenet2012 builder (tests/fake_imagenet.py: random JPEGs of varied sizes, 4 train shard files)."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from common.errors import ConfigError
from data import builders, imagenet, pipeline
from data.registry import get_dataset_spec
from helpers import checkpoint_values, run_module, run_train_py


def _jpeg(pixels: np.ndarray) -> tf.Tensor:
    return tf.io.encode_jpeg(pixels.astype(np.uint8), quality=95)


def test_train_crops_are_224_pixels_and_a_function_of_the_seed():
    encoded = _jpeg(np.random.default_rng(0).integers(0, 256, (90, 150, 3)))
    crops = [imagenet.train_decoder(encoded, tf.constant([0, seed], tf.int64)).numpy() for seed in (1, 1, 2)]
    assert crops[0].shape == (224, 224, 3) and crops[0].dtype == np.float32
    assert 0 <= crops[0].min() and crops[0].max() <= 255
    np.testing.assert_array_equal(crops[0], crops[1])  # Same seed, same crop.
    assert not np.array_equal(crops[0], crops[2])


def test_eval_crop_is_the_central_224_of_256():
    """A 100 x 200 image, black except a white central square just larger than the crop: the crop is all white."""
    pixels = np.zeros((100, 200, 3))
    crop = int(224 / 256 * 100)  # 87 pixels of the shorter edge.
    top, left = (100 - crop + 1) // 2, (200 - crop + 1) // 2
    pixels[top - 2:top + crop + 2, left - 2:left + crop + 2] = 255
    image = imagenet.eval_decoder(_jpeg(pixels)).numpy()
    assert image.shape == (224, 224, 3)
    assert image.min() > 200, image.min()  # JPEG ringing at the square's edge stays well above black.
    shifted = np.roll(pixels, 20, axis=1)  # Negative control: off-centre by 20 pixels, black enters the crop.
    assert imagenet.eval_decoder(_jpeg(shifted)).numpy().min() < 50


def test_fake_imagenet_batches_have_static_shapes_and_exact_eval(fake_imagenet):
    _, builder = fake_imagenet
    spec = get_dataset_spec("imagenet2012")
    assert pipeline.reads_by_shard(spec, builder)
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0, num_replicas_in_sync=4)
    train = pipeline.make_train_input_fn(spec, builder, global_batch_size=8, seed=0, start_step=0)(context)
    assert train.element_spec[0].shape == (2, 224, 224, 3)
    eval_input_fn, steps = pipeline.make_eval_input_fn(spec, builder, global_batch_size=8)
    labels, masks = [], []
    for pipeline_id in range(2):
        for _, label, mask in eval_input_fn(tf.distribute.InputContext(2, pipeline_id, 4)).take(2 * steps):
            labels.extend(label.numpy()[mask.numpy() == 1])
            masks.append(mask.numpy())
    expected = [int(example["label"]) for example in builder.as_dataset(
        split="validation", decoders={"image": tfds.decode.SkipDecoding()}).as_numpy_iterator()]
    assert sorted(labels) == sorted(expected) and np.concatenate(masks).sum() == 20  # Every image once.


def test_staging_imagenet_without_the_tar_files_says_where_to_put_them(tmp_path):
    result = run_module("stage", "--dataset=imagenet2012", f"--data_dir={tmp_path}/tfds",
                        f"--manual_dir={tmp_path}/empty")
    assert result.returncode == 2, result.stderr
    assert f"Cannot prepare 'imagenet2012' from {tmp_path}/empty" in result.stderr
    assert "ILSVRC2012_img_train.tar" in result.stderr
    assert (f"Check that {tmp_path}/empty holds the files the instructions name, then" in result.stderr
            and f"then rerun: python -m stage --dataset=imagenet2012 --manual_dir={tmp_path}/empty "
                f"--data_dir={tmp_path}/tfds" in result.stderr), result.stderr


def test_staging_from_the_tar_files_builds_the_dataset(tmp_path):
    from tests.fake_imagenet import write_manual_dir

    manual = write_manual_dir(str(tmp_path / "manual"), classes=2, per_class=3, validation=4)
    result = run_module("stage", "--dataset=imagenet2012", f"--data_dir={tmp_path}/tfds", f"--manual_dir={manual}")
    assert result.returncode == 0, result.stderr
    builder = builders.find_builder("imagenet2012", str(tmp_path / "tfds"))
    assert builder.info.splits["train"].num_examples == 6 and builder.info.splits["validation"].num_examples == 4


def test_unprepared_imagenet_is_a_config_error_naming_the_fix(tmp_path):
    """Training or a preflight on a DATA_DIR without ImageNet: the staging command, and nothing written there."""
    with pytest.raises(ConfigError, match="ILSVRC2012_img_train.tar.*python -m stage --dataset=imagenet2012 "
                                          f"--manual_dir=DIR --data_dir={tmp_path}"):
        builders.load_builder(get_dataset_spec("imagenet2012"), str(tmp_path))
    assert not list(tmp_path.iterdir())


N = 4  # Steps per segment, 2 per loop.
COMMON = ["--gin_param=DATASET='imagenet2012'", "--gin_param=MODEL='resnet'", "--gin_param=resnet.depth=8",
          "--gin_param=STRATEGY='mirrored'", "--gin_param=VIRTUAL_DEVICES=2", "--gin_param=GLOBAL_BATCH_SIZE=8",
          "--gin_param=STEPS_PER_LOOP=2", "--gin_param=CHECKPOINT_EVERY=2", "--gin_param=EVAL_EVERY=0",
          "--gin_param=experiment.optimizer='sgd'", "--gin_param=experiment.lr_schedule='constant'",
          "--gin_param=LEARNING_RATE=0.01"]


@pytest.mark.slow
# ~60 s: three runs of a ResNet on 224-pixel crops with their exports; the resume must cross a checkpoint mid-epoch
# through the real imagenet2012 reader, which only these runs do.
def test_imagenet_training_resumes_exactly_through_train_py(tmp_path, fake_imagenet):
    """4 steps, then resumed to 8 (mid-epoch: 60 train images = 7.5 global batches, so step 8 is in epoch 1)
    equals 8 straight steps, bit for bit: the by-shard order and the crops continue exactly."""
    data_dir = f"--gin_param=DATA_DIR='{fake_imagenet[0]}'"
    interrupted, straight = str(tmp_path / "interrupted"), str(tmp_path / "straight")
    for steps, model_dir in ((N, interrupted), (2 * N, interrupted), (2 * N, straight)):
        result = run_train_py(*COMMON, data_dir, f"--gin_param=TRAIN_STEPS={steps}", f"--model_dir={model_dir}")
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Reading imagenet2012:train by shard" in result.stdout + result.stderr
    resumed, uninterrupted = checkpoint_values(interrupted), checkpoint_values(straight)
    assert resumed.keys() == uninterrupted.keys() and len(resumed) > 10
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)
