"""Input pipelines for `strategy.distribute_datasets_from_function`: per-replica batches from one TFDS dataset.

Training data order is a pure function of (SEED, global step), the same for any replica or host count:
- the train split is one endless stream of positions 0, 1, 2, ...; position p is example
  index_shuffle(p mod N, seed=(SEED, epoch = p div N)) of the split: a full, stateless permutation per epoch;
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

import contextlib
import functools
import importlib
import logging
import math

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from common.errors import ConfigError, StorageError, shorten
from common.storage_errors import describe, transient
from data import downloads, shard_stream
from data.registry import DatasetSpec, stage_name

log = logging.getLogger(__name__)

IN_MEMORY_LIMIT_BYTES = 1 << 30  # Larger train splits are read by shard file (see DatasetSpec.read_by_shard).


def find_builder(tfds_name: str, data_dir: str | None, *,
                 module: str | None = None) -> tfds.core.DatasetBuilder:
    """The TFDS builder of `tfds_name` in `data_dir` (prepared or not); `module` registers a bundled builder."""
    if module:
        importlib.import_module(module)
    try:
        return tfds.builder(tfds_name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:  # Its message lists every TFDS name: not repeated.
        raise ConfigError(f"TFDS has no dataset {tfds_name!r}, and none is staged in DATA_DIR={data_dir!r}. Stage "
                          f"your data there once: python -m data.stage --name={tfds_name} --data_dir=DIR with "
                          "--from_npz=FILE, --from_csv=..., --from_tfrecord=... or --from_image_folder=DIR "
                          "(docs/data.md, 'Bring your own data'), then pass the same DATA_DIR.") from error


def prepare(builder: tfds.core.DatasetBuilder, download_config: tfds.download.DownloadConfig | None = None) -> bool:
    """Builds the dataset into its data_dir unless it is there already; returns whether it built anything.
    `download_config` carries e.g. manual_dir for datasets without a download (ImageNet)."""
    if builder.is_prepared():
        return False
    instructions = (getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None) or "").strip()
    def stage_command(manual_dir: str) -> str:
        return (f"python -m data.stage --dataset={stage_name(builder.name)} --manual_dir={manual_dir} "
                f"--data_dir={builder.data_dir_root}")

    if instructions and not (download_config and download_config.manual_dir):
        # Nothing can be built without the manually downloaded files: say so before writing anything.
        raise ConfigError(f"{builder.name!r} is not prepared in {builder.data_dir_root} and has no download. "
                          f"{' '.join(instructions.split())} Then stage it once: {stage_command('DIR')}")
    log.info("Preparing TFDS dataset %r in %s (once).", builder.name, builder.data_dir)
    tfds.disable_progress_bar()  # Seconds for the bundled data; the bars would bury the first screen.
    offline = None
    try:
        downloading = (contextlib.nullcontext() if instructions or _is_bundled(builder)
                       else downloads.fail_fast_when_offline())
        with downloading as offline:
            builder.download_and_prepare(download_config=download_config)
    except AssertionError as error:  # How TFDS builders report missing or incomplete manual downloads.
        detail = " ".join(str(error).split())[:500].rstrip(".")
        manual_dir = download_config.manual_dir if download_config else None
        if manual_dir:
            instructions = " ".join(instructions.split()).rstrip(".")
            named = f" ({instructions})" if instructions and instructions not in detail else ""
            raise ConfigError(f"Cannot prepare {builder.name!r} from {manual_dir}: {detail}. Check that {manual_dir} "
                              f"holds the files the instructions name{named}, then rerun: "
                              f"{stage_command(manual_dir)}") from error
        raise ConfigError(f"Cannot prepare {builder.name!r} in {builder.data_dir_root}: {detail}. TFDS builders fail "
                          "this way when source files are missing or incomplete: if it reads manually downloaded "
                          f"files, put them in a folder DIR and stage it once: {stage_command('DIR')}") from error
    except downloads.download_errors() as error:
        detail = offline or shorten(str(error), 300)  # A failed lookup says it all; TFDS's text repeats it.
        raise ConfigError(f"Downloading {builder.name!r} failed ({type(error).__name__}: {detail}): this machine "
                          f"cannot reach its source. {_stage_elsewhere(builder)}") from error
    return True


def _stage_elsewhere(builder: tfds.core.DatasetBuilder) -> str:
    return (f"Stage it where there is internet (python -m data.stage --dataset={stage_name(builder.name)} "
            "--data_dir=DIR), copy DIR here or to gs://, and pass DATA_DIR=DIR.")


def _is_bundled(builder: tfds.core.DatasetBuilder) -> bool:
    """A builder of this repository (data/...): it builds offline, from files or generators it carries."""
    return type(builder).__module__.split(".")[0] == __name__.split(".")[0]


def load_builder(spec: DatasetSpec, data_dir: str | None) -> tfds.core.DatasetBuilder:
    """The TFDS builder for `spec`, built into `data_dir` first if it is not there yet (offline for bundled data)."""
    try:
        builder = find_builder(spec.tfds_name, data_dir, module=spec.module)
        try:
            prepare(builder)
        except FileExistsError:  # Another process (a worker of the same job) finished preparing it first.
            builder = find_builder(spec.tfds_name, data_dir, module=spec.module)
            if not builder.is_prepared():
                raise
            log.info("%r was prepared by another process meanwhile; using it.", spec.tfds_name)
    except (OSError, tf.errors.OpError, RuntimeError) as error:  # Not a directory, permission denied, disk full, ...
        if isinstance(error, RuntimeError) and not transient(error):  # TFDS wraps what it met in a RuntimeError.
            raise
        if transient(error) and str(data_dir).startswith("gs://"):  # The bucket did not answer: a rerun can work.
            raise StorageError(f"DATA_DIR={data_dir!r} did not answer while reading {spec.tfds_name!r} "
                               f"({describe(error)}). Nothing was written: rerun the same command once it "
                               "answers.") from error
        raise ConfigError(f"DATA_DIR={data_dir!r} cannot be used for {spec.tfds_name!r} ({describe(error)}). Pass a "
                          "DATA_DIR you can write to (TFDS prepares the dataset there once), e.g. "
                          "--gin_param=\"DATA_DIR='~/tensorflow_datasets'\".") from error
    return builder


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


def split_size(builder: tfds.core.DatasetBuilder, split: str) -> int:
    """Examples in `split`: from the dataset's metadata, or counted when the metadata has no split sizes (as with
    TFDS's mock data, which the tests use for download-only datasets)."""
    if split in builder.info.splits:
        return builder.info.splits[split].num_examples
    log.info("No split sizes in the metadata of %r: counting %s.", builder.name, split)
    return int(builder.as_dataset(split=split, shuffle_files=False).reduce(0, lambda count, _: count + 1))


def make_train_input_fn(spec: DatasetSpec, builder: tfds.core.DatasetBuilder, *, global_batch_size: int, seed: int,
                        start_step: int):
    """Returns input_fn(InputContext) -> dataset of (features, target, position) per-replica batches, starting at
    `start_step`. position (int64) is the example's place in the training stream, unique over the run and the same
    at any replica count: the training step keys each example's dropout mask by it."""
    if reads_by_shard(spec, builder):
        shard_stream.check_readable(builder, spec.train_split)
        return functools.partial(shard_stream.make_train_dataset, spec, builder, global_batch_size=global_batch_size,
                                 seed=seed, start_step=start_step)
    num_examples = split_size(builder, spec.train_split)
    if num_examples < global_batch_size:
        raise ConfigError(f"GLOBAL_BATCH_SIZE={global_batch_size} is larger than the {num_examples} examples of "
                          f"{spec.tfds_name}:{spec.train_split}; use a smaller batch.")

    def input_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        examples = decoded_train_split(spec, builder)

        def batch_at(positions):
            return examples_at(spec, builder, examples, positions, num_examples=num_examples, seed=seed)

        per_replica = context.get_per_replica_batch_size(global_batch_size)
        # Positions first, batched, then everything per batch (vectorised); Dataset.range, not counter: the
        # counter is a single-threaded scan (~56k elements/s).
        return (tf.data.Dataset.range(start_step * global_batch_size, 2 ** 62)
                .shard(context.num_input_pipelines, context.input_pipeline_id)
                .batch(per_replica, drop_remainder=True)
                .map(batch_at, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
                .prefetch(tf.data.AUTOTUNE))

    return input_fn


def decoded_train_split(spec: DatasetSpec, builder: tfds.core.DatasetBuilder) -> dict[str, tf.Tensor]:
    """The whole train split in memory, {feature key: tensor over examples in file order}, for random access
    (in_memory_bytes: a few MB to ~150 MB for the shipped datasets); images the task can use decoded are decoded
    here, once, not per drawn example."""
    num_examples = split_size(builder, spec.train_split)
    return _encoded_split(spec, builder, spec.train_split).batch(num_examples).get_single_element()


def examples_at(spec: DatasetSpec, builder: tfds.core.DatasetBuilder, examples: dict, positions: tf.Tensor, *,
                num_examples: int, seed: int) -> tuple:
    """(features, targets, positions) of the examples at training-stream `positions` (one per-replica batch, int64),
    drawn from `examples` (decoded_train_split): epoch-wise permutations seeded by (SEED, epoch); a batch spans at
    most two epochs (batch <= split). Augmentation is seeded by (SEED, position). The tf.data pipeline and the
    on-device split (data/device_split.py) both call this, so both give the same batches."""
    seed_tensor = tf.constant(seed, tf.int64)
    epochs, indices = positions // num_examples, positions % num_examples
    first_epoch = epochs[0]
    shuffled = tf.where(
        tf.equal(epochs, first_epoch),
        tf.random.experimental.index_shuffle(indices, seed=tf.stack([seed_tensor, first_epoch]),
                                             max_index=num_examples - 1),
        tf.random.experimental.index_shuffle(indices, seed=tf.stack([seed_tensor, first_epoch + 1]),
                                             max_index=num_examples - 1))
    batch = {key: tf.gather(values, shuffled) for key, values in examples.items()}
    seeds = tf.stack([tf.fill(tf.shape(positions), seed_tensor), positions], axis=1)
    features, targets = spec.task.prepare_batch(batch, builder.info.features, seeds=seeds)
    return features, targets, positions


def make_eval_input_fn(spec: DatasetSpec, builder: tfds.core.DatasetBuilder, *, global_batch_size: int):
    """Returns (input_fn, num_steps): input_fn(InputContext) -> dataset of (features, target, mask) per-replica batches
    that covers the eval split once in `num_steps` global batches, the last one padded.

    mask is 1.0 for real examples and 0.0 for padding; every metric must weight by it.
    """
    num_examples = split_size(builder, spec.eval_split)
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
        real = _encoded_split(spec, builder, split).map(decode, num_parallel_calls=tf.data.AUTOTUNE,
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


def _encoded_split(spec: DatasetSpec, builder: tfds.core.DatasetBuilder, split: str) -> tf.data.Dataset:
    """The split in file order, as dicts of the task's features, decoded as the task's `decoders` say (fixed-size
    images decoded; images with their own decoder, such as ImageNet's JPEGs, still encoded)."""
    keys = spec.task.keys
    missing = [key for key in keys if key not in builder.info.features]
    if missing:
        raise ConfigError(f"The task of {spec.tfds_name!r} reads feature(s) {missing}, which the dataset does not "
                          f"have (it has {sorted(builder.info.features.keys())}); set the task's keys in "
                          "data/registry.py.")
    dataset = builder.as_dataset(split=split, shuffle_files=False, decoders=spec.task.decoders(builder.info.features),
                                 read_config=tfds.ReadConfig(interleave_cycle_length=1, add_tfds_id=False))
    return dataset.map(lambda example: {key: example[key] for key in keys})
