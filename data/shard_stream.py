"""Training order for splits too large for host memory (ImageNet): read by TFDS shard file, seekable by step.

The in-memory order of data/pipeline.py needs the whole encoded split on every host; ImageNet's ~140 GB does not
fit. Here the train stream of each input pipeline (one per host) is built from the split's TFRecord shard files:
- epoch e permutes the S shard files with index_shuffle, seeded by (SEED, e), and cuts that order into blocks of
  `shards_per_block` files; block j goes to input pipeline j mod P, so each host reads only its own files (every
  host reading every file would multiply the storage traffic of a P-host pod slice by P);
- a block's records are read into memory (~4 x 140 MB for ImageNet) and permuted by index_shuffle seeded by
  (SEED, e, j): one batch mixes examples of several shards, and TFDS writes each shard as a hashed, i.e. random,
  sample of the split;
- each pipeline's stream is endless (its blocks of epoch 0, then of epoch 1, ...) and global step s takes
  positions [s * G/P, (s + 1) * G/P) of it (G the global batch);
- a resumed run finds the (epoch, block, offset) of its first position from the shard lengths in the dataset's
  metadata and starts there: it reads the one block it starts in and skips `offset` records of it, nothing older;
- augmentation is stateless, seeded by (SEED, position * P + pipeline id).
Hence the order is a pure function of (SEED, step, P): independent of the replica count on one host (every
single-host TPU, GPU and CPU run), but a pod slice resumed with a different host count reads another order from the
resume point on (no example is lost or repeated within that epoch's plan; the plans just differ).
"""

import dataclasses
import logging
import os

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from common.errors import ConfigError
from data.spec import DatasetSpec

log = logging.getLogger(__name__)

SHARDS_PER_BLOCK = 4  # ImageNet (1,024 train shards of ~1,250 images): ~5,000 examples mixed, ~560 MB in memory.
BLOCKS_IN_FLIGHT = 3  # Blocks read ahead at once (each with one reader per file): ~1.7 GB of host memory for ImageNet.
_READ_BUFFER_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """The split's shard files and how one input pipeline walks them."""

    paths: tuple[str, ...]
    lengths: tuple[int, ...]  # Examples per file, from the dataset's metadata.
    seed: int
    num_pipelines: int
    pipeline_id: int
    shards_per_block: int = SHARDS_PER_BLOCK

    @property
    def num_blocks(self) -> int:
        return -(-len(self.paths) // self.shards_per_block)

    @property
    def blocks_per_epoch(self) -> int:
        """Blocks this pipeline reads per epoch: j = pipeline_id, pipeline_id + P, ... < num_blocks."""
        return len(range(self.pipeline_id, self.num_blocks, self.num_pipelines))

    def shard_order(self, epoch) -> tf.Tensor:
        """The epoch's permutation of shard indices (a tensor op: the same eagerly and inside tf.data)."""
        num_shards = len(self.paths)
        return tf.random.experimental.index_shuffle(
            tf.range(num_shards, dtype=tf.int64), seed=tf.stack([tf.constant(self.seed, tf.int64),
                                                                 tf.cast(epoch, tf.int64)]),
            max_index=num_shards - 1)

    def block_lengths(self, epoch: int) -> np.ndarray:
        """Examples in each of this pipeline's blocks of `epoch`, in reading order."""
        lengths = np.asarray(self.lengths, np.int64)[self.shard_order(epoch).numpy()]
        starts = np.arange(0, len(self.paths), self.shards_per_block)
        per_block = np.add.reduceat(lengths, starts)
        return per_block[self.pipeline_id::self.num_pipelines]

    def locate(self, position: int) -> tuple[int, int]:
        """(block counter t, offset) of this pipeline's stream position: block t is block t mod B of epoch t div B
        (B = blocks_per_epoch) and the position is its record number `offset` after the block's permutation."""
        epoch = 0
        while True:
            lengths = self.block_lengths(epoch)
            if position < lengths.sum():
                block = int(np.searchsorted(np.cumsum(lengths), position, side="right"))
                return epoch * self.blocks_per_epoch + block, int(position - lengths[:block].sum())
            position -= int(lengths.sum())
            epoch += 1


def check_readable(builder: tfds.core.DatasetBuilder, split: str, *, dataset: str | None = None) -> None:
    """A ConfigError unless `split` is prepared as TFRecord shard files with example counts in its metadata;
    `dataset`: what `python -m stage --dataset=` takes for it (default tfds:NAME)."""
    name = f"{builder.name}:{split}"
    if split not in builder.info.splits or not builder.info.splits[split].num_examples:
        manual_dir = " --manual_dir=DIR" if getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None) else ""
        raise ConfigError(f"{name} has no shard metadata in {builder.data_dir}: prepare the dataset there first: "
                          f"python -m stage --dataset={dataset or 'tfds:' + builder.name}{manual_dir} "
                          f"--data_dir={builder.data_dir_root}")
    if builder.info.file_format != tfds.core.FileFormat.TFRECORD:
        raise ConfigError(f"{name} is stored as {builder.info.file_format.value}; reading by shard needs TFRecord "
                          "files: prepare it with TFDS's default file_format='tfrecord'.")


def shard_plan(builder: tfds.core.DatasetBuilder, split: str, *, seed: int,
               context: tf.distribute.InputContext) -> ShardPlan:
    """The ShardPlan of `split` for the input pipeline `context`; a ConfigError when the split cannot be read so."""
    check_readable(builder, split)
    instructions = builder.info.splits[split].file_instructions
    plan = ShardPlan(paths=tuple(os.fspath(item.filename) for item in instructions),
                     lengths=tuple(item.examples_in_shard for item in instructions), seed=seed,
                     num_pipelines=context.num_input_pipelines, pipeline_id=context.input_pipeline_id,
                     shards_per_block=min(SHARDS_PER_BLOCK, max(1, len(instructions) // context.num_input_pipelines)))
    if plan.num_blocks < plan.num_pipelines:
        raise ConfigError(f"{builder.name}:{split} has {len(plan.paths)} shard files, fewer than the "
                          f"{plan.num_pipelines} input pipelines (hosts): every host needs files of its own. Prepare "
                          "it with more shards (tfds.download.DownloadConfig(num_shards=...)).")
    return plan


def make_train_dataset(spec: DatasetSpec, builder: tfds.core.DatasetBuilder, context: tf.distribute.InputContext, *,
                       global_batch_size: int, seed: int, start_step: int, streams: int = 1,
                       stream: int = 0) -> tf.data.Dataset:
    """This input pipeline's per-replica batches of (features, target, example key) from `start_step` on (see the module
    docstring); the key (position * P + pipeline id) is unique over the run and keys the dropout masks. Only batches
    stream, stream + streams, ... (a tf.data service's share: it reads every block, decodes its own batches)."""
    plan = shard_plan(builder, spec.train_split, seed=seed, context=context)
    per_pipeline = global_batch_size // context.num_input_pipelines
    start_position = start_step * per_pipeline
    first_block, offset = plan.locate(start_position)
    log.info("Reading %s:%s by shard: %d files, blocks of %d, pipeline %d of %d starts at block %d + %d records.",
             builder.name, spec.train_split, len(plan.paths), plan.shards_per_block, plan.pipeline_id,
             plan.num_pipelines, first_block, offset)
    paths = tf.constant(plan.paths)
    features = builder.info.features
    seed_tensor = tf.constant(seed, tf.int64)

    def read_block(block_counter):
        """The records of one block, permuted: a string vector of the block's length."""
        epoch = block_counter // plan.blocks_per_epoch
        block = plan.pipeline_id + (block_counter % plan.blocks_per_epoch) * plan.num_pipelines
        shards = plan.shard_order(epoch)[block * plan.shards_per_block:(block + 1) * plan.shards_per_block]
        records = (tf.data.TFRecordDataset(tf.gather(paths, shards), buffer_size=_READ_BUFFER_BYTES,
                                           num_parallel_reads=plan.shards_per_block)
                   .batch(1 << 30).get_single_element())
        block_seed = tf.random.experimental.stateless_fold_in(tf.stack([seed_tensor, epoch]), block)
        count = tf.shape(records, out_type=tf.int64)[0]
        order = tf.random.experimental.index_shuffle(tf.range(count), seed=block_seed, max_index=count - 1)
        return tf.gather(records, order)

    def example_at(position, record):
        example = features.deserialize_example(record, decoders=spec.task.decoders(features))
        key = position * plan.num_pipelines + plan.pipeline_id  # Unique over the run's examples, on every host.
        model_input, target = spec.task.prepare({name: example[name] for name in spec.task.keys}, features,
                                                seed=tf.stack([seed_tensor, key]))
        return model_input, target, key

    per_replica = context.get_per_replica_batch_size(global_batch_size)
    records = (tf.data.Dataset.counter(first_block)
               .map(read_block, num_parallel_calls=BLOCKS_IN_FLIGHT, deterministic=True)  # Read ahead, in order.
               .unbatch()
               .skip(offset)
               .enumerate(start=start_position))
    if streams > 1:
        records = records.batch(per_replica, drop_remainder=True).shard(streams, stream).unbatch()
    return (records
            .map(example_at, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .batch(per_replica, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE))
