"""TFDS builder access: find a dataset's builder, build it once into DATA_DIR (offline for the bundled ones), and
read a split in file order. What the input pipelines (data/pipeline.py, data/shard_stream.py, data/device_split.py)
and staging (stage/) share; errors say how to stage what is missing."""

import contextlib
import importlib
import logging
import weakref

import tensorflow as tf
import tensorflow_datasets as tfds

from common.errors import ConfigError, StorageError, shorten
from common.settings import how_to_set
from common.storage_errors import describe, transient
from data import downloads
from data.spec import DatasetSpec, check_task_features

log = logging.getLogger(__name__)
# Splits counted (a builder without split sizes in its metadata), per builder: a run asks for a split's size in
# several places (the pipelines, the split on the devices, the preflight), and counting reads the whole split.
_COUNTED: "weakref.WeakKeyDictionary[tfds.core.DatasetBuilder, dict[str, int]]" = weakref.WeakKeyDictionary()


def find_builder(tfds_name: str, data_dir: str | None, *,
                 module: str | None = None) -> tfds.core.DatasetBuilder:
    """The TFDS builder of `tfds_name` in `data_dir` (prepared or not); `module` registers a bundled builder."""
    if module:
        importlib.import_module(module)
    try:
        return tfds.builder(tfds_name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:  # Its message lists every TFDS name: not repeated.
        raise ConfigError(f"TFDS has no dataset {tfds_name!r}, and none is staged in DATA_DIR={data_dir!r}. Stage "
                          f"your data there once: python -m stage --name={tfds_name} --data_dir=DIR with "
                          "--from_npz=FILE, --from_csv=..., --from_tfrecord=... or --from_image_folder=DIR "
                          "(docs/data.md, 'Bring your own data'), then pass the same DATA_DIR.") from error


def prepare(builder: tfds.core.DatasetBuilder, download_config: tfds.download.DownloadConfig | None = None, *,
            dataset: str | None = None) -> bool:
    """Builds the dataset into its data_dir unless it is there already; returns whether it built anything.
    `download_config` carries e.g. manual_dir for datasets without a download (ImageNet); `dataset` is the name
    `python -m stage --dataset=` takes for it, for the hints (default tfds:NAME)."""
    dataset = dataset or f"tfds:{builder.name}"
    if builder.is_prepared():
        return False
    instructions = (getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None) or "").strip()
    def stage_command(manual_dir: str) -> str:
        return (f"python -m stage --dataset={dataset} --manual_dir={manual_dir} "
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
                          f"cannot reach its source. {_stage_elsewhere(builder, dataset)}") from error
    return True


def _stage_elsewhere(builder: tfds.core.DatasetBuilder, dataset: str) -> str:
    return (f"Stage it where there is internet (python -m stage --dataset={dataset} "
            "--data_dir=DIR), copy DIR here or to gs://, and pass DATA_DIR=DIR.")


def _is_bundled(builder: tfds.core.DatasetBuilder) -> bool:
    """A builder of this repository (data/...): it builds offline, from files or generators it carries."""
    return type(builder).__module__.split(".")[0] == __name__.split(".")[0]


def load_builder(spec: DatasetSpec, data_dir: str | None) -> tfds.core.DatasetBuilder:
    """The TFDS builder for `spec`, built into `data_dir` first if it is not there yet (offline for bundled data)."""
    try:
        builder = find_builder(spec.tfds_name, data_dir, module=spec.module)
        try:
            prepare(builder, dataset=spec.stage_name())
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


def split_size(builder: tfds.core.DatasetBuilder, split: str) -> int:
    """Examples in `split`: from the dataset's metadata, or counted (once per builder) when the metadata has no split
    sizes (as with TFDS's mock data, which the tests use for download-only datasets)."""
    if split in builder.info.splits:
        return builder.info.splits[split].num_examples
    counted = _COUNTED.setdefault(builder, {})
    if split not in counted:  # Once per builder: its files do not change under it.
        log.info("No split sizes in the metadata of %r: counting %s.", builder.name, split)
        counted[split] = int(builder.as_dataset(split=split, shuffle_files=False).reduce(0, lambda count, _: count + 1))
    return counted[split]


def encoded_split(spec: DatasetSpec, builder: tfds.core.DatasetBuilder, split: str) -> tf.data.Dataset:
    """The split in file order, as dicts of the task's features, decoded as the task's `decoders` say (fixed-size
    images decoded; images with their own decoder, such as ImageNet's JPEGs, still encoded)."""
    keys = spec.task.keys
    check_task_features(spec, builder.info.features)
    dataset = builder.as_dataset(split=split, shuffle_files=False, decoders=spec.task.decoders(builder.info.features),
                                 read_config=tfds.ReadConfig(interleave_cycle_length=1, add_tfds_id=False))
    return dataset.map(lambda example: {key: example[key] for key in keys})


def check_settings(config) -> None:
    """DATA_DIR: a directory (local or gs://), or None for TFDS's default."""
    data_dir = config.data_dir
    if data_dir is not None and not isinstance(data_dir, str):
        raise ConfigError(f"DATA_DIR={data_dir!r} must be a directory (a string) or None for TFDS's default; e.g. "
                          f"{how_to_set('data_dir', '/data/tensorflow_datasets')}.")
    if data_dir is not None and not data_dir.strip():
        raise ConfigError(f"DATA_DIR={data_dir!r} is empty (an unset variable in a script?): TFDS would build the data "
                          "in the current directory. Set a directory, e.g. "
                          f"{how_to_set('data_dir', '/data/tensorflow_datasets')}, or None for TFDS's default.")
