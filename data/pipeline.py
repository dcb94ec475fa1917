"""Input pipelines for `strategy.distribute_datasets_from_function`: per-replica batches from one TFDS dataset.

Training data order is a pure function of (SEED, global step), the same for any replica or host count:
- the train split is one endless stream of positions 0, 1, 2, ...; position p is example
  epoch_permutation(p mod N, seed=SEED, epoch=p div N) of the split (common/keyed_random.py): a full, stateless
  permutation per epoch, integer ops only, so a TPU's compiled loop draws the same examples as the host
  (data/device_split.py);
- global step s trains on stream positions [s * G, (s + 1) * G) for global batch G, so a resumed run starts
  exactly where the interrupted one stopped (the pipeline is positioned from the step counter; TF cannot
  checkpoint distributed iterators);
- each input pipeline keeps every P-th position (P = number of pipelines, i.e. hosts), so the union of one step's
  per-replica batches is the same G examples whatever the replica or host count;
- augmentation is stateless, seeded by (SEED, position); each example carries its position, which keys its dropout
  mask (models/layers.py), so dropout too is the same at any replica count and on resume.
Random access needs the encoded split in host memory: right for splits under 1 GiB (the shipped small datasets
take up to ~150 MB). Larger ones (ImageNet) are read by shard file instead, with an order that is a function of
(SEED, step, host count): data/shard_stream.py.

Evaluation covers every example of the eval split exactly once: the split is padded with masked-out examples to a
whole number of global batches, so every per-replica batch has the same static shape (what TPUs need). Each input
pipeline (host) reads only its own contiguous 1/P of the split (TFDS split slicing reads only those files).
"""

import functools
import logging
import math

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from common.errors import ConfigError
from common.keyed_random import epoch_permutation
from common.settings import how_to_set, require_int
from data import builders, shard_stream
from data.spec import DatasetSpec

log = logging.getLogger(__name__)

IN_MEMORY_LIMIT_BYTES = 1 << 30  # Larger train splits are read by shard file (see DatasetSpec.read_by_shard).


def reads_by_shard(spec: DatasetSpec, builder: tfds.core.DatasetBuilder) -> bool:
    """Whether the train split is read by shard file (data/shard_stream.py) rather than held in memory."""
    if spec.read_by_shard is not None:
        return spec.read_by_shard
    if spec.train_split not in builder.info.splits:
        return False  # No metadata (TFDS's mock data): nothing large.
    return in_memory_bytes(spec, builder) > IN_MEMORY_LIMIT_BYTES


def in_memory_bytes(spec: DatasetSpec, builder: tfds.core.DatasetBuilder) -> int:
    """What the train split takes in memory: features the task reads decoded (fixed-size images: pixels, not PNG
    bytes) at their decoded size, at least the encoded size of the split."""
    split = builder.info.splits[spec.train_split]
    skipped = spec.task.decoders(builder.info.features)
    decoded = 0
    for key in spec.task.keys:
        feature = builder.info.features[key]
        shape = getattr(feature, "shape", None)
        if key in skipped or shape is None or None in shape:
            continue  # Kept encoded, or of no fixed size: counted in the encoded size.
        decoded += int(np.prod(shape, dtype=np.int64)) * feature.tf_dtype.size
    return max(split.num_bytes, split.num_examples * decoded)


def make_train_input_fn(spec: DatasetSpec, builder: tfds.core.DatasetBuilder, *, global_batch_size: int, seed: int,
                        start_step: int, services=None):
    """Returns input_fn(InputContext) -> dataset of (features, target, position) per-replica batches, starting at
    `start_step`. position (int64) is the example's place in the training stream, unique over the run and the same
    at any replica count: the training step keys each example's dropout mask by it. `services`
    (data/service.InputServices): the batches are made by those tf.data services, the same ones in the same order."""
    if reads_by_shard(spec, builder):
        shard_stream.check_readable(builder, spec.train_split, dataset=spec.stage_name())
        make = functools.partial(shard_stream.make_train_dataset, spec, builder, global_batch_size=global_batch_size,
                                 seed=seed, start_step=start_step)
    else:
        num_examples = builders.split_size(builder, spec.train_split)
        check_batch_fits(spec, num_examples, global_batch_size)
        make = functools.partial(_in_memory_train_dataset, spec, builder, num_examples=num_examples,
                                 global_batch_size=global_batch_size, seed=seed, start_step=start_step,
                                 read_in_pipeline=services is not None)
    if services is None:
        return make

    def input_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        first = start_step * global_batch_size + context.input_pipeline_id
        stride = context.num_input_pipelines * context.get_per_replica_batch_size(global_batch_size)
        return services.distribute(lambda count, index: make(context, streams=count, stream=index),
                                   first_position_of=lambda batch_index: first + batch_index * stride)

    return input_fn


def _in_memory_train_dataset(spec: DatasetSpec, builder: tfds.core.DatasetBuilder,
                             context: tf.distribute.InputContext, *, num_examples: int, global_batch_size: int,
                             seed: int, start_step: int, streams: int = 1, stream: int = 0,
                             read_in_pipeline: bool = False) -> tf.data.Dataset:
    """This input pipeline's per-replica batches from `start_step` on; only batches stream, stream + streams, ...
    (a tf.data service's share). `read_in_pipeline`: the pipeline reads the split from DATA_DIR itself (and keeps
    it in its memory) instead of capturing this process's copy, as a tf.data service must."""
    per_replica = context.get_per_replica_batch_size(global_batch_size)
    pipelines = context.num_input_pipelines
    first = start_step * global_batch_size + context.input_pipeline_id

    def batch_at(batch_index, examples):
        # This pipeline keeps every P-th stream position; its batch b is the b-th run of per_replica of those.
        positions = first + pipelines * (batch_index * per_replica + tf.range(per_replica, dtype=tf.int64))
        return examples_at(spec, builder, examples, positions, num_examples=num_examples, seed=seed)

    batches = tf.data.Dataset.range(stream, (MAX_EXAMPLES - first) // (pipelines * per_replica), streams)
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True}
    if read_in_pipeline:
        split = builders.encoded_split(spec, builder, spec.train_split).batch(num_examples).cache().repeat()
        drawn = tf.data.Dataset.zip(batches, split).map(batch_at, **parallel)
    else:
        examples = decoded_train_split(spec, builder)
        drawn = batches.map(lambda batch_index: batch_at(batch_index, examples), **parallel)
    return drawn.prefetch(tf.data.AUTOTUNE)


def check_batch_fits(spec: DatasetSpec, num_examples: int, global_batch_size: int) -> None:
    """A ConfigError when one global batch is larger than the train split (a batch spans at most two epochs)."""
    if num_examples < global_batch_size:
        raise ConfigError(f"GLOBAL_BATCH_SIZE={global_batch_size} is larger than the {num_examples} examples of "
                          f"{spec.tfds_name}:{spec.train_split}; pass --gin_param=GLOBAL_BATCH_SIZE=<at most "
                          f"{num_examples}>.")


def decoded_train_split(spec: DatasetSpec, builder: tfds.core.DatasetBuilder) -> dict[str, tf.Tensor]:
    """The whole train split in memory, {feature key: tensor over examples in file order}, for random access
    (in_memory_bytes: a few MB to ~150 MB for the shipped datasets); images the task can use decoded are decoded
    here, once, not per drawn example."""
    num_examples = builders.split_size(builder, spec.train_split)
    return builders.encoded_split(spec, builder, spec.train_split).batch(num_examples).get_single_element()


def examples_at(spec: DatasetSpec, builder: tfds.core.DatasetBuilder, examples: dict, positions: tf.Tensor, *,
                num_examples: int, seed: int) -> tuple:
    """(features, targets, positions) of the examples at training-stream `positions` (one per-replica batch, int64),
    drawn from `examples` (decoded_train_split): epoch-wise permutations seeded by (SEED, epoch); a batch spans at
    most two epochs (batch <= split). Augmentation is seeded by (SEED, position). The tf.data pipeline and the
    on-device split (data/device_split.py) both call this, so both give the same batches."""
    seed_tensor = tf.constant(seed, tf.int64)
    # One call, each position with its own epoch's keys (a batch spans at most two epochs).
    shuffled = epoch_permutation(positions % num_examples, seed=seed, epoch=positions // num_examples,
                                 size=num_examples)
    batch = {key: tf.gather(values, shuffled) for key, values in examples.items()}
    seeds = tf.stack([tf.fill(tf.shape(positions), seed_tensor), positions], axis=1)
    features, targets = spec.task.prepare_batch(batch, builder.info.features, seeds=seeds)
    return features, targets, positions


def make_eval_input_fn(spec: DatasetSpec, builder: tfds.core.DatasetBuilder, *, global_batch_size: int):
    """Returns (input_fn, num_steps): input_fn(InputContext) -> dataset of (features, target, mask) per-replica batches
    that covers the eval split once in `num_steps` global batches, the last one padded.

    mask is 1.0 for real examples and 0.0 for padding; every metric must weight by it.
    """
    num_examples = builders.split_size(builder, spec.eval_split)
    num_steps = math.ceil(num_examples / global_batch_size)
    padded_size = num_steps * global_batch_size

    def input_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        def decode(example):
            return (*spec.task.prepare(example, builder.info.features), 1.0)

        pipelines, pipeline_id = context.num_input_pipelines, context.input_pipeline_id
        # This pipeline's contiguous part of the split; every part is padded to the same length.
        begin, end = pipeline_id * num_examples // pipelines, (pipeline_id + 1) * num_examples // pipelines
        split = spec.eval_split if pipelines == 1 else f"{spec.eval_split}[{begin}:{end}]"
        part_size = end - begin
        real = builders.encoded_split(spec, builder, split).map(decode, num_parallel_calls=tf.data.AUTOTUNE,
                                                        deterministic=True)
        features_spec, target_spec, _ = real.element_spec
        if not (features_spec.shape.is_fully_defined() and target_spec.shape.is_fully_defined()):
            raise ConfigError(f"The task of {spec.tfds_name!r} prepares examples of shape {features_spec.shape} "
                              f"(target {target_spec.shape}); every example needs one static shape: pad or truncate "
                              "sequences to a fixed length, give images a fixed size. TPUs compile one shape, and "
                              "evaluation pads the last batch with examples of that shape.")
        padding = tf.data.Dataset.from_tensors((tf.zeros(features_spec.shape, features_spec.dtype),
                                                tf.zeros(target_spec.shape, target_spec.dtype),
                                                tf.constant(0.0))).repeat(padded_size // pipelines - part_size)
        per_replica = context.get_per_replica_batch_size(global_batch_size)
        return (real.concatenate(padding)
                .batch(per_replica, drop_remainder=True)
                .prefetch(tf.data.AUTOTUNE))

    return input_fn, num_steps


# The training stream's positions (step * GLOBAL_BATCH_SIZE + index, int64) end at 2**62.
MAX_EXAMPLES = 2 ** 62


def check_settings(config) -> None:
    """GLOBAL_BATCH_SIZE, and TRAIN_STEPS of them within the training stream's positions."""
    require_int("global_batch_size", config.global_batch_size, minimum=1, example=128)
    if config.train_steps * config.global_batch_size > MAX_EXAMPLES:
        raise ConfigError(f"TRAIN_STEPS={config.train_steps} x GLOBAL_BATCH_SIZE={config.global_batch_size} examples "
                          "is more than the training stream's 2**62 positions; use fewer steps, e.g. "
                          f"{how_to_set('train_steps', MAX_EXAMPLES // config.global_batch_size)}.")
