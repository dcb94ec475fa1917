"""Stores data a user already has as a TFDS dataset in a data_dir (local or gs://), with TFDS's own
`tfds.dataset_builders.store_as_tfds_dataset`: the shards, the features and the split sizes land in the standard
layout (`DATA_DIR/NAME/1.0.0/`), so `DATASET='tfds:NAME'` trains from it with no builder code (data/staged_spec.py).

The sources are read and checked first (stage/sources.py, csv_source.py, images.py, text_folder.py) and their
features decided (stage/columns.py); only then is anything written.
A dataset already there is left alone unless `force`, which deletes that version and stores it anew; a fingerprint of
its source (stage/fingerprint.py), written last, tells whether it was staged from the same source.
"""

import logging

from common.errors import ConfigError
from common.storage_paths import join

log = logging.getLogger(__name__)

VERSION = "1.0.0"


def check_name(name: str) -> None:
    """A new TFDS dataset name: snake_case, and neither a dataset TFDS already registers nor the name or TFDS name
    of one of the template's datasets (data/registry.py): either would be shadowed, mix its builder's metadata with
    the staged files, or (pasted into DATASETS as python -m stage suggests) replace the shipped entry."""
    import tensorflow_datasets as tfds

    from data.registry import DATASETS
    from stage.flag_checks import check_name_format

    check_name_format(name)
    bundled = next((key for key, spec in DATASETS.items() if spec.tfds_name == name), None)
    if bundled is not None:
        raise ConfigError(f"--name={name!r} is the TFDS name of the template's dataset DATASET={bundled!r} "
                          f"(data/registry.py); choose another name (e.g. --name=my_{name}).")
    if name in DATASETS:  # The printed DatasetSpec, pasted into DATASETS, would replace the shipped entry.
        raise ConfigError(f"--name={name!r} is the name of the template's dataset DATASET={name!r} "
                          f"(data/registry.py); choose another name (e.g. --name=my_{name}).")
    if name in tfds.list_builders(with_community_datasets=False):
        raise ConfigError(f"--name={name!r} is a dataset TFDS already knows; choose another name (e.g. "
                          f"--name=my_{name}).")


def read_source(args) -> tuple:
    """(features, {split: {feature: array}}, how it was split: '' or a sentence for the metadata) from the one
    --from_* source of the parsed command line `args`; with --test_fraction, the one source split by
    stage/split.py."""
    from stage import sources as own_sources
    from stage import split as own_split
    from stage.columns import columns

    class_names, feature_names, id_column, whole = None, None, None, args.test_fraction is not None
    split_note = ""
    image_size, resize = getattr(args, "image_size", None), getattr(args, "resize", None)
    image_size = tuple(int(size) for size in image_size.split(",")) if image_size else None
    if args.from_npz:
        splits = own_sources.read_npz(args.from_npz, args.npz_keys, whole=whole)
    elif args.from_csv:
        paths = ({"all": args.from_csv} if whole else own_sources.parse_split_paths(args.from_csv, "--from_csv"))
        if not whole:
            own_sources.check_splits(paths, "--from_csv")
        from stage.csv_header import split_list
        from stage.csv_source import read_csv

        id_column = getattr(args, "id_column", None)
        splits, feature_names = read_csv(paths, args.label, args.text, id_column=id_column,
                                         drop_columns=split_list(getattr(args, "drop_columns", None)))
    elif args.from_tfrecord:
        if not args.features:
            raise ConfigError("--from_tfrecord needs --features, the stored features' names, dtypes and shapes, e.g. "
                              "--features='features:float32[8],label:int64'.")
        splits = own_sources.read_tfrecords(own_sources.parse_split_paths(args.from_tfrecord, "--from_tfrecord"),
                                            args.features, args.label)
    elif args.from_text_folder:
        from stage.text_folder import read_text_folder

        splits, class_names = read_text_folder(args.from_text_folder.rstrip("/"), whole=whole)
    else:
        from stage.images import read_image_folder

        splits, class_names = read_image_folder(args.from_image_folder.rstrip("/"), whole=whole,
                                                image_size=image_size, resize=resize,
                                                channels=getattr(args, "channels", None))
    try:
        if whole:
            inputs, labels = splits["all"]
            seed = args.seed or 0
            by_class = class_names is not None or own_split.is_class_label(labels, args.label_kind)
            splits = own_split.split_examples(inputs, labels, args.test_fraction, seed, by_class)
            split_note = " " + own_split.describe(args.test_fraction, seed, by_class, splits)
        resized = (*image_size, resize) if image_size else None  # Recorded for the export (data/staged_spec.py).
        return (*columns(splits, args.label_kind, class_names, feature_names, image_resize=resized,
                         id_column=id_column), split_note)
    except ConfigError as error:  # About the arrays read: named by the source they were read from.
        flag = next(flag for flag in ("from_npz", "from_csv", "from_tfrecord", "from_image_folder",
                                      "from_text_folder") if getattr(args, flag))
        raise ConfigError(f"--{flag}={getattr(args, flag)}: {error}") from None


def store(name: str, data_dir: str, features, splits: dict, *, source: dict, force: bool = False,
          description: str = "") -> str:
    """Writes `splits` ({split: {feature: array}}) as TFDS dataset `name` into `data_dir`, then the fingerprint
    `source` (stage/fingerprint.py): 'built'. When it was there already (and not `force`), nothing is written:
    'same' (staged from this source), 'not compared' (staged before fingerprints were kept), or a ConfigError (staged
    from another source: --force or another --name)."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from stage import fingerprint as own_fingerprint
    from stage.tfds_noise import quiet_local_build

    version_dir = join(data_dir, name, VERSION)
    if tf.io.gfile.exists(join(version_dir, "dataset_info.json")):
        if not force:
            return "same" if own_fingerprint.compare(version_dir, source, name, data_dir) else "not compared"
        log.info("--force: deleting %s before storing it anew.", version_dir)
        tf.io.gfile.rmtree(version_dir)

    def examples(columns: dict):
        count = len(next(iter(columns.values())))
        for index in range(count):
            yield index, {key: values[index] for key, values in columns.items()}

    tfds.disable_progress_bar()
    with quiet_local_build():  # TFDS's "has no dataset_info.json" and "Downloading ... Unknown size": not faults.
        tfds.dataset_builders.store_as_tfds_dataset(
            name=name, version=VERSION, features=features, data_dir=data_dir,
            split_datasets={split: examples(columns) for split, columns in splits.items()},
            description=description or "Staged with python -m stage.", disable_shuffling=True)
    own_fingerprint.write(version_dir, source)  # Last: only a complete dataset has one.
    return "built"
