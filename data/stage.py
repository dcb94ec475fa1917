"""Stage a TFDS dataset into a data_dir, typically on GCS, so TPU hosts can read it:

  python -m data.stage --dataset=digits --data_dir=gs://BUCKET/tensorflow_datasets
  python -m data.stage --dataset=cifar10 --data_dir=gs://BUCKET/tensorflow_datasets   # any DATASET name
  python -m data.stage --dataset=tfds:fashion_mnist --data_dir=gs://BUCKET/tensorflow_datasets  # any TFDS name
  python -m data.stage --dataset=imagenet2012 --manual_dir=/data/ilsvrc --data_dir=gs://BUCKET/tensorflow_datasets

Builds the dataset (TFDS `download_and_prepare`) straight into `data_dir`; the bundled digits builder needs no
network, registered TFDS datasets download from their source first; ImageNet has no download: put
ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar (from image-net.org, after registering) in --manual_dir
(a few hours and ~300 GB of local disk for the build; TFDS writes ~1,024 train shards).
Idempotent: when the dataset is already prepared there, it says so and does nothing. The bucket is checked first
(exists, writable: exit 2 otherwise). Then pass the same path as DATA_DIR.
"""

import argparse
import logging
import sys


def stage(dataset: str, data_dir: str, manual_dir: str | None = None) -> bool:
    """Prepares `dataset` in `data_dir`; returns False when it was already there (nothing done)."""
    import tensorflow_datasets as tfds

    from common.gcs_checks import check_gcs_paths
    from data.pipeline import find_builder, prepare
    from data.registry import get_dataset_spec

    check_gcs_paths({"--data_dir": data_dir})
    download_config = tfds.download.DownloadConfig(manual_dir=manual_dir) if manual_dir else None
    if dataset.startswith("tfds:"):
        return prepare(find_builder(dataset[len("tfds:"):], data_dir), download_config)
    spec = get_dataset_spec(dataset)
    return prepare(find_builder(spec.tfds_name, data_dir, module=spec.module), download_config)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="a DATASET name (data/registry.py) or tfds:<TFDS name>")
    parser.add_argument("--data_dir", required=True, help="TFDS data_dir to build into, e.g. gs://BUCKET/tfds")
    parser.add_argument("--manual_dir", help="folder of manually downloaded files (ImageNet's tar files)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stdout)
    from common.errors import ConfigError

    try:
        built = stage(args.dataset, args.data_dir, args.manual_dir)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    print(f"{args.dataset}: {'built into' if built else 'already staged in'} {args.data_dir}"
          f"{'' if built else ' (nothing to do)'}. Use DATA_DIR='{args.data_dir}'.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
