"""Reading by shard file (data/shard_stream.py): exact resume, each example once per epoch, per-host files.

Real TFDS shard files: the bundled digits dataset prepared with 7 shards (205-206 examples each), forced to be read
by shard; the order checks compare preprocessed images and labels exactly (no augmentation for digits).
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from common.errors import ConfigError
from data import builders, pipeline, shard_stream
from data.registry import get_dataset_spec

GLOBAL_BATCH = 24
NUM_EXAMPLES = 1437
SPEC = dataclasses.replace(get_dataset_spec("digits"), read_by_shard=True)


@pytest.fixture(scope="module")
def sharded_digits(tmp_path_factory):
    builder = builders.find_builder(SPEC.tfds_name, str(tmp_path_factory.mktemp("digits_7_shards")),
                                    module=SPEC.module)
    builders.prepare(builder, tfds.download.DownloadConfig(num_shards=7))
    assert len(builder.info.splits["train"].shard_lengths) == 7
    return builder


def _stream(builder, *, start_step=0, steps=10, pipelines=1, pipeline_id=0, seed=0, spec=SPEC):
    """`steps` batches of one input pipeline, as (images, labels) arrays of shape [steps * G/P, ...]."""
    input_fn = pipeline.make_train_input_fn(spec, builder, global_batch_size=GLOBAL_BATCH, seed=seed,
                                            start_step=start_step)
    context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline_id,
                                         num_replicas_in_sync=pipelines)
    batches = list(input_fn(context).take(steps).as_numpy_iterator())
    return np.concatenate([images for images, _, _ in batches]), np.concatenate([labels for _, labels, _ in batches])


def _image_multiset(images):
    return sorted(image.tobytes() for image in images)


@pytest.mark.parametrize("resume_step", [1, 37, 61, 95])  # In the first block, mid-epoch, just past and into epoch 1.
def test_a_resumed_stream_continues_exactly(sharded_digits, resume_step):
    full_images, full_labels = _stream(sharded_digits, steps=100)
    images, labels = _stream(sharded_digits, start_step=resume_step, steps=100 - resume_step)
    np.testing.assert_array_equal(labels, full_labels[resume_step * GLOBAL_BATCH:])
    np.testing.assert_array_equal(images, full_images[resume_step * GLOBAL_BATCH:])


def test_each_of_three_pipelines_resumes_exactly(sharded_digits):
    per_pipeline = GLOBAL_BATCH // 3
    for pipeline_id in range(3):
        _, full = _stream(sharded_digits, steps=150, pipelines=3, pipeline_id=pipeline_id)
        _, resumed = _stream(sharded_digits, start_step=101, steps=49, pipelines=3, pipeline_id=pipeline_id)
        np.testing.assert_array_equal(resumed, full[101 * per_pipeline:])


def test_negative_control_a_resume_that_drops_the_offset_is_caught(sharded_digits, monkeypatch):
    """If the resume restarted at the beginning of its block, the comparison above would fail."""
    full_images, _ = _stream(sharded_digits, steps=60)
    locate = shard_stream.ShardPlan.locate
    monkeypatch.setattr(shard_stream.ShardPlan, "locate", lambda self, position: (locate(self, position)[0], 0))
    images, _ = _stream(sharded_digits, start_step=37, steps=23)
    assert not np.array_equal(images, full_images[37 * GLOBAL_BATCH:])


def test_every_example_once_per_epoch(sharded_digits):
    expected = _image_multiset(_stream(sharded_digits, steps=60, spec=dataclasses.replace(SPEC, read_by_shard=False))
                               [0][:NUM_EXAMPLES])  # The in-memory order is a permutation of the split.
    images, labels = _stream(sharded_digits, steps=120)
    epoch_0, epoch_1 = images[:NUM_EXAMPLES], images[NUM_EXAMPLES:2 * NUM_EXAMPLES]
    assert _image_multiset(epoch_0) == expected and _image_multiset(epoch_1) == expected
    assert not np.array_equal(labels[:NUM_EXAMPLES], labels[NUM_EXAMPLES:2 * NUM_EXAMPLES])  # Another order.


def test_three_pipelines_read_disjoint_files_that_cover_the_split_once(sharded_digits):
    expected = _image_multiset(_stream(sharded_digits, steps=60, spec=dataclasses.replace(SPEC, read_by_shard=False))
                               [0][:NUM_EXAMPLES])
    context = lambda pipeline_id: tf.distribute.InputContext(3, pipeline_id, 3)  # noqa: E731
    union, files = [], []
    for pipeline_id in range(3):
        plan = shard_stream.shard_plan(sharded_digits, "train", seed=0, context=context(pipeline_id))
        epoch_0 = int(plan.block_lengths(0).sum())
        images, _ = _stream(sharded_digits, steps=epoch_0 // 8 + 1, pipelines=3, pipeline_id=pipeline_id)
        union.extend(images[:epoch_0])
        order = plan.shard_order(0).numpy()
        files.append({int(shard) for block in range(pipeline_id, plan.num_blocks, 3)
                      for shard in order[block * plan.shards_per_block:(block + 1) * plan.shards_per_block]})
    assert _image_multiset(union) == expected
    assert sum(map(len, files)) == 7 and set.union(*files) == set(range(7))  # Each file read by one pipeline.


def test_the_seed_changes_the_order(sharded_digits):
    assert not np.array_equal(_stream(sharded_digits, steps=2)[1], _stream(sharded_digits, steps=2, seed=1)[1])


def test_splits_over_the_memory_limit_are_read_by_shard(sharded_digits, monkeypatch):
    default = get_dataset_spec("digits")
    assert not pipeline.reads_by_shard(default, sharded_digits)
    monkeypatch.setattr(pipeline, "IN_MEMORY_LIMIT_BYTES", 1000)
    assert pipeline.reads_by_shard(default, sharded_digits)


def test_the_memory_estimate_counts_images_decoded_when_the_task_decodes_them(sharded_digits):
    """Fixed-size images are held decoded (pixels, not PNG bytes), so the in-memory size is the larger of the
    encoded split and examples x (8 x 8 uint8 image + int64 label); a task that keeps images encoded (its own
    decoder, as ImageNet's) counts the encoded bytes only."""
    import dataclasses

    default = get_dataset_spec("digits")
    split = sharded_digits.info.splits["train"]
    assert pipeline.in_memory_bytes(default, sharded_digits) == max(split.num_bytes, split.num_examples * (64 + 8))
    keeps_encoded = dataclasses.replace(default.task, train_decoder=lambda image, seed: image)
    encoded = dataclasses.replace(default, task=keeps_encoded)
    assert pipeline.in_memory_bytes(encoded, sharded_digits) == max(split.num_bytes, split.num_examples * 8)


def test_more_hosts_than_shard_files_is_a_config_error(sharded_digits):
    with pytest.raises(ConfigError, match="7 shard files, fewer than the 8 input pipelines"):
        shard_stream.shard_plan(sharded_digits, "train", seed=0, context=tf.distribute.InputContext(8, 0, 8))


def test_a_split_without_shard_metadata_names_the_stage_command_to_run(tmp_path):
    """A builder whose dataset is not prepared in DATA_DIR: the exact command, with this DATASET name and folder."""
    builder = builders.find_builder(SPEC.tfds_name, str(tmp_path), module=SPEC.module)
    with pytest.raises(ConfigError) as raised:
        shard_stream.check_readable(builder, "train", dataset=SPEC.stage_name())
    assert str(raised.value).endswith(f"prepare the dataset there first: python -m stage --dataset=digits "
                                      f"--data_dir={tmp_path}"), raised.value
