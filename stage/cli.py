"""Stage a dataset into a TFDS data_dir (local, or gs:// so TPU hosts can read it): a known one, or your own data.

Known datasets (TFDS `download_and_prepare` straight into data_dir):
  python -m stage --dataset=digits --data_dir=gs://BUCKET/tensorflow_datasets
  python -m stage --dataset=cifar10 --data_dir=gs://BUCKET/tensorflow_datasets   # any DATASET name
  python -m stage --dataset=tfds:fashion_mnist --data_dir=gs://BUCKET/tensorflow_datasets  # any TFDS name
  python -m stage --dataset=imagenet2012 --manual_dir=/data/ilsvrc --data_dir=gs://BUCKET/tensorflow_datasets

Your own data, as TFDS dataset NAME (then train it with --gin_param="DATASET='tfds:NAME'" and the same DATA_DIR):
  python -m stage --name=NAME --data_dir=DIR --from_npz=data.npz        # x_train, y_train, x_test, y_test
  python -m stage --name=NAME --data_dir=DIR --from_csv=train=train.csv,test=test.csv --label=COLUMN
      [--id_column=id] [--drop_columns=COL,COL]   # an id column keys predictions; dropped columns are left out
  python -m stage --name=NAME --data_dir=DIR --from_tfrecord='train=tr-*.tfrecord,test=te-*.tfrecord' \\
      --features='features:float32[8],label:int64'
  python -m stage --name=NAME --data_dir=DIR --from_image_folder=IMAGES  # IMAGES/{train,test}/<class>/*.png
  python -m stage --name=NAME --data_dir=DIR --from_image_folder=IMAGES --image_size=32,32 --resize=pad \\
      --channels=3   # images of any sizes and colour modes, resized at staging and by the export's signature
Text to classify (a text column of a CSV, or one .txt file per example in class folders):
  python -m stage --name=NAME --data_dir=DIR --from_csv=train=train.csv,test=test.csv --label=COLUMN --text=COL
  python -m stage --name=NAME --data_dir=DIR --from_text_folder=TEXTS    # TEXTS/{train,test}/<class>/*.txt
One file or folder, split for you (seeded, stratified by class; x and y arrays in an .npz, IMAGES/<class>/*.png,
TEXTS/<class>/*.txt):
  python -m stage --name=NAME --data_dir=DIR --from_csv=data.csv --label=COLUMN --test_fraction=0.2 --seed=0

The bundled digits builder needs no network, registered TFDS datasets download from their source first; ImageNet has
no download: put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar (from image-net.org, after registering) in
--manual_dir (a few hours and ~300 GB of local disk for the build; TFDS writes ~1,024 train shards).
Idempotent: when the dataset is already in data_dir, it says so and does nothing; --force rebuilds your own data.
Your own data staged again under the same --name from a different source (other file contents, another kind of
source or other flags) exits 2 instead: pass --force to replace it, or another --name.
A gs:// bucket is checked first (exists, writable: exit 2 otherwise). Then pass the same path as DATA_DIR.
"""

import argparse
import logging
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SOURCES = ("from_npz", "from_csv", "from_tfrecord", "from_image_folder", "from_text_folder")
# A shipped experiment whose model and settings fit each inferred task: where to start.
# The small CNN builds for any image size (convolutions, global average pooling), the Transformer takes raw strings.
STARTING_CONFIGS = {"ImageClassification": "configs/experiments/mnist_cnn.gin",
                    "TextClassification": "configs/experiments/synthetic_reviews_transformer.gin",
                    "TabularClassification": "configs/experiments/breast_cancer_mlp.gin",
                    "TabularRegression": "configs/experiments/synthetic_housing_mlp.gin"}


def stage(dataset: str, data_dir: str, manual_dir: str | None = None) -> bool:
    """Prepares `dataset` in `data_dir`; returns False when it was already there (nothing done)."""
    import tensorflow_datasets as tfds

    from common.extras import check_gcs_paths
    from data.builders import find_builder, prepare
    from data.registry import DATASETS, get_dataset_spec

    check_gcs_paths({"--data_dir": data_dir})
    download_config = tfds.download.DownloadConfig(manual_dir=manual_dir) if manual_dir else None
    if dataset.startswith("tfds:"):
        name = dataset[len("tfds:"):]
        # A bundled builder (e.g. tfds:sklearn_digits) is registered only once its module is imported.
        module = next((spec.module for spec in DATASETS.values() if spec.tfds_name == name), None)
        return prepare(find_builder(name, data_dir, module=module), download_config, dataset=dataset)
    spec = get_dataset_spec(dataset)
    return prepare(find_builder(spec.tfds_name, data_dir, module=spec.module), download_config, dataset=dataset)


def stage_own(args: argparse.Namespace) -> str:
    """Stores the --from_* source as TFDS dataset --name in --data_dir: 'built'; when it was there (and no --force)
    'same' or 'not compared' (see own_data.store); a ConfigError when it was staged from another source."""
    from common.extras import check_gcs_paths
    from stage import fingerprint as own_fingerprint
    from stage import writer as own_data

    own_data.check_name(args.name)
    check_gcs_paths({"--data_dir": args.data_dir})
    features, splits, split_note = own_data.read_source(args)  # Read and checked before anything is written.
    source = own_fingerprint.of_source(args)
    return own_data.store(args.name, args.data_dir, features, splits, source=source, force=args.force,
                          description=f"Staged with python -m stage {source['source']}.{split_note}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", required=True, help="TFDS data_dir to build into, e.g. gs://BUCKET/tfds")
    known = parser.add_argument_group("a known dataset")
    known.add_argument("--dataset", help="a DATASET name (data/registry.py) or tfds:<TFDS name>")
    known.add_argument("--manual_dir", help="folder of manually downloaded files (ImageNet's tar files)")
    own = parser.add_argument_group("your own data (one --from_*)")
    own.add_argument("--name", help="the new TFDS dataset's name (lower_case); train it as DATASET='tfds:NAME'")
    own.add_argument("--from_npz", help=".npz file with x_train, y_train, x_test, y_test (or see --npz_keys)")
    own.add_argument("--npz_keys", help="the arrays per split: train=INPUTS:LABELS,test=INPUTS:LABELS")
    own.add_argument("--from_csv", help="train=FILE,test=FILE: CSV files with a header row (or FILE with "
                     "--test_fraction)")
    own.add_argument("--from_tfrecord", help="train=GLOB,test=GLOB: TFRecord files of tf.train.Example")
    own.add_argument("--features", help="with --from_tfrecord: NAME:DTYPE[SHAPE],... (float32, int64, image)")
    own.add_argument("--from_image_folder", help="folder with train/<class>/*.png and test/<class>/*.png (or "
                     "<class>/*.png with --test_fraction)")
    own.add_argument("--image_size", help="with --from_image_folder: H,W (e.g. 32,32): resize every image to H x W "
                     "(by --resize), so a folder of mixed sizes stages; the export then takes images of any size "
                     "and resizes them the same way in its graph")
    own.add_argument("--resize", help="with --image_size: pad (the default: keep the aspect ratio, fit inside, pad "
                     "with zeros), crop (keep the aspect ratio, cover, centre crop) or stretch (change the aspect "
                     "ratio)")
    own.add_argument("--channels", help="with --from_image_folder: 1 (grayscale) or 3 (RGB): convert every image "
                     "(alpha dropped), so a folder of mixed colour modes stages; the export takes this many channels")
    own.add_argument("--from_text_folder", help="folder with train/<class>/*.txt and test/<class>/*.txt, one example "
                     "per UTF-8 file (or <class>/*.txt with --test_fraction)")
    own.add_argument("--text", help="with --from_csv: the column holding the text to classify (detected when it is "
                     "the only column besides --label); the other columns are left out")
    own.add_argument("--id_column", help="with --from_csv: a column that names each row (an id), left out of the "
                     "features and recorded, so python -m tools.predict keys its predictions by it")
    own.add_argument("--drop_columns", help="with --from_csv: COLUMN,COLUMN,...: columns left out of the features "
                     "(e.g. free-text notes, a date)")
    own.add_argument("--test_fraction", type=float, help="split one CSV, .npz (arrays x, y), image or text folder: "
                     "this share of the examples (0 < F < 1) becomes test, stratified by class")
    own.add_argument("--seed", type=int, help="with --test_fraction: the seed of the split (default 0)")
    own.add_argument("--label", default=None, help="the label column (CSV) or feature (TFRecord); default label")
    own.add_argument("--label_kind", choices=("auto", "class", "number"), default="auto",
                     help="class (classification) or number (regression); auto: text and integers are classes")
    own.add_argument("--force", action="store_true", help="delete and rebuild the dataset if it is staged already")
    args = parser.parse_args(argv)
    sources = [flag for flag in SOURCES if getattr(args, flag)]
    if bool(args.dataset) + len(sources) != 1:
        parser.error("pass exactly one of --dataset or " + ", ".join(f"--{flag}" for flag in SOURCES))
    if sources and not args.name:
        parser.error(f"--{sources[0]} needs --name, the dataset's name (e.g. --name=my_data)")
    if args.force and args.dataset:
        parser.error("--force rebuilds your own data (--from_*); to rebuild --dataset, delete its folder in "
                     "--data_dir")
    return args


_STATUS = {"built": "built into", "there": "already staged in", "same": "already staged from this source in",
           "not compared": "already staged in"}
_NOTES = {"built": "", "there": " (nothing to do)", "same": " (nothing to do; --force rebuilds)",
          "not compared": " (nothing to do), but from a source this command cannot compare with this one: it was "
                          "staged before python -m stage recorded its sources. If the data changed, pass --force to "
                          "rebuild it"}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # Before TensorFlow loads: its C++ start-up lines off.
    from common.tf_logging import PROGRESS_FORMAT, PROGRESS_TIME_FORMAT, quiet_tensorflow

    quiet_tensorflow()
    logging.basicConfig(level=logging.INFO, format=PROGRESS_FORMAT, datefmt=PROGRESS_TIME_FORMAT, stream=sys.stdout)
    from common.errors import ConfigError
    from stage.flag_checks import check_args
    from tasks.image_resize import DEFAULT_MODE

    try:
        check_args(args)  # Standard library only: a bad flag answers before TensorFlow loads (~7 s).
        if args.test_fraction is not None and args.seed is None:
            args.seed = 0  # The default seed, recorded as such (the same split as --seed=0).
        if args.image_size is not None and args.resize is None:
            args.resize = DEFAULT_MODE  # Recorded as such (the same staging as --resize=pad).
        if args.dataset:
            status = "built" if stage(args.dataset, args.data_dir, args.manual_dir) else "there"
        else:
            status = stage_own(args)
        print(f"{args.dataset or args.name}: {_STATUS[status]} {args.data_dir}{_NOTES[status]}. "
              f"Use DATA_DIR='{args.data_dir}'.", flush=True)
        if args.name:
            _print_how_to_train(args.name, args.data_dir)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    return 0


def _print_how_to_train(name: str, data_dir: str) -> None:
    """The gin lines that train the staged dataset, and the DatasetSpec it stands for (to register and edit); when
    no shipped task fits its features, that, and what to do (the data is staged all the same)."""
    from common.errors import ConfigError
    from data.builders import find_builder
    from data.staged_spec import registry_lines, spec_from_metadata

    try:
        spec = spec_from_metadata(name, data_dir)
    except ConfigError as error:
        print(f"The data is staged, but no shipped task fits it: {error}\n"
              f"To train it: add a DatasetSpec(tfds_name=\"{name}\", ...) with a task for these features to DATASETS "
              f"in data/registry.py (docs/data.md, 'Bring your own data'; tasks/ has the shipped tasks), then pass "
              f"DATASET='<its key>' and DATA_DIR='{data_dir}'.", flush=True)
        return
    config = STARTING_CONFIGS.get(type(spec.task).__name__, "configs/default.gin")
    # The tabular starting config reports AUC, precision and recall, which need exactly two classes.
    metrics = (" --gin_param=\"experiment.metrics=['accuracy']\"" if config == STARTING_CONFIGS["TabularClassification"]
               and spec.task.num_classes != 2 else "")
    metrics += _sized_run(config, find_builder(name, data_dir).info.splits["train"].num_examples)
    print(f"Train it: python train.py --gin_file={config} --gin_param=\"DATASET='tfds:{name}'\" "
          f"--gin_param=\"DATA_DIR='{data_dir}'\"{metrics} --model_dir=runs/{name}\n"
          f"The task inferred from its metadata, to paste into DATASETS of data/registry.py if you want to change "
          f"it (then DATASET='{name}'):\n{registry_lines(name, spec)}", flush=True)


# The suggested run: this many epochs of the train split at the suggested batch (the shipped configs train their
# datasets 6-35 epochs; a small dataset needs the upper end), at least MIN_STEPS, rounded up to a multiple of
# STEPS_ROUNDING; a warm-up longer than WARMUP_SHARE of that is shortened to it.
EPOCHS = 30
MIN_STEPS = 200
STEPS_ROUNDING = 100
WARMUP_SHARE = 0.1


def _sized_run(config: str, train_examples: int) -> str:
    """The gin params that size the starting `config`'s run to a train split of `train_examples`: GLOBAL_BATCH_SIZE
    when the config's is larger than the split (training would refuse it; the largest power of two that fits),
    TRAIN_STEPS for EPOCHS epochs (at least MIN_STEPS), and cosine.warmup_steps when the config's warm-up would take
    more than WARMUP_SHARE of those steps."""
    path = os.path.join(REPO_ROOT, config)
    batch, params = _config_setting(path, "GLOBAL_BATCH_SIZE"), ""
    if batch is None:
        return ""
    if batch > train_examples:
        batch = 1 << (train_examples.bit_length() - 1)
        params += f" --gin_param=GLOBAL_BATCH_SIZE={batch}"
    steps = max(MIN_STEPS, EPOCHS * -(-train_examples // batch))
    steps = -(-steps // STEPS_ROUNDING) * STEPS_ROUNDING
    params += f" --gin_param=TRAIN_STEPS={steps}"
    warmup = _config_setting(path, "cosine.warmup_steps")
    if warmup is not None and warmup > steps * WARMUP_SHARE:
        params += f" --gin_param=cosine.warmup_steps={int(steps * WARMUP_SHARE)}"
    return params


def _config_setting(path: str, name: str) -> int | None:
    """The whole number a gin file sets `name` (e.g. GLOBAL_BATCH_SIZE) to, following its includes (the last
    setting wins, as in gin); None when it sets none."""
    import re

    value = None
    for line in open(path, encoding="utf-8"):
        included = re.match(r"\s*include\s+'([^']+)'", line)
        if included:
            value = _config_setting(os.path.join(REPO_ROOT, included.group(1)), name) or value
        setting = re.match(rf"\s*{re.escape(name)}\s*=\s*(\d+)\s*(#.*)?$", line)
        if setting:
            value = int(setting.group(1))
    return value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
