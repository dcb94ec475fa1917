"""The checks of a `python -m stage` command line that need no TensorFlow: they run before it is imported (~7 s on 2 CPU
cores), so a bad flag, a conflicting pair or a missing local source file answers in a fraction of a second.

Standard library only (tests/test_stage_fast.py asserts that TensorFlow is not loaded by them). What only the data
can tell (an .npz without the arrays, a gs:// path, a bad cell) is checked when it is read (stage/sources.py);
a local CSV's header row (the --label, --text, --id_column and --drop_columns columns, a repeated name) is checked
here.
"""

import os
import re

from common.errors import ConfigError
from stage.csv_header import feature_columns, read_local_header, split_list
from tasks.image_resize import CHANNELS, MODES

NAME = re.compile(r"[a-z][a-z0-9_]*")
_SPLIT_PAIRS = re.compile(r"^\s*\w+\s*=")  # 'train=a.csv,...', as opposed to one file's path.


def names_splits(value: str) -> bool:
    """Whether a --from_csv / --npz_keys value names splits (train=...,test=...) rather than one file or pair."""
    return bool(_SPLIT_PAIRS.match(value))


def check_name_format(name: str) -> None:
    """A TFDS dataset name: snake_case (the registry checks, which need TFDS, are stage/writer.check_name)."""
    if not NAME.fullmatch(name or ""):
        raise ConfigError(f"--name={name!r} is not a TFDS dataset name: use lower-case letters, digits and _, "
                          "starting with a letter (e.g. --name=my_data).")


def check_args(args) -> None:
    """A ConfigError for the first bad flag value or combination of the parsed command line `args`, or a local
    source that does not exist; nothing for a --dataset command but its own checks (done by TFDS)."""
    if args.text is not None and not args.from_csv:
        raise ConfigError(f"--text={args.text} names the text column of --from_csv; for --dataset and the other "
                          "sources drop it (--from_text_folder reads one text per .txt file).")
    if args.label is not None and not (args.from_csv or args.from_tfrecord):
        source = next((f"--{flag}" for flag in ("from_npz", "from_image_folder", "from_text_folder", "dataset")
                       if getattr(args, flag, None)), "this source")
        raise ConfigError(f"--label={args.label} names the label column of --from_csv or feature of --from_tfrecord; "
                          f"{source} has its own labels (an .npz's labels array via --npz_keys, a folder's class "
                          "folders): drop --label.")
    args.label = "label" if args.label is None else args.label
    _check_column_flags(args)
    if args.dataset:
        if args.test_fraction is not None:
            raise ConfigError(f"--test_fraction={args.test_fraction} splits your own data (--from_csv, --from_npz, "
                              f"--from_image_folder, --from_text_folder); --dataset={args.dataset} has its own splits: "
                              "drop it.")
        return
    check_name_format(args.name)
    _check_image_flags(args)
    _check_split_flags(args)
    _check_local_sources(args)


def _check_column_flags(args) -> None:
    """--id_column and --drop_columns name columns of --from_csv (checked against each local file's header in
    _check_local_sources); normalises args.drop_columns to 'a,b', as the fingerprint records it."""
    given = [f"--{flag}={getattr(args, flag)}" for flag in ("id_column", "drop_columns")
             if getattr(args, flag, None) is not None]
    if given and not args.from_csv:
        raise ConfigError(f"{' '.join(given)} names columns of --from_csv; the other sources have no named columns: "
                          "drop it.")
    if getattr(args, "drop_columns", None) is not None:
        if not split_list(args.drop_columns):
            raise ConfigError(f"--drop_columns={args.drop_columns!r} names no column: pass COLUMN,COLUMN,... (e.g. "
                              "--drop_columns=notes,date), or drop the flag.")
        args.drop_columns = ",".join(split_list(args.drop_columns))
    if getattr(args, "id_column", None) is not None and args.text is not None:
        raise ConfigError(f"--id_column={args.id_column} keys the rows of a CSV of feature columns; with --text="
                          f"{args.text} the other columns are left out already (a text file is predicted line by "
                          "line): drop --id_column.")


# --image_size's bound: ImageNet models train at 224-600 pixels a side; 4096 x 4096 x 3 is 48 MiB per image.
MAX_IMAGE_SIDE = 4096


def parse_image_size(value: str) -> tuple[int, int]:
    """'32,32' -> (32, 32): --image_size's height and width, each a whole number >= 1; a ConfigError otherwise."""
    parts = [part.strip() for part in value.replace("x", ",").split(",")]
    if len(parts) != 2 or not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise ConfigError(f"--image_size={value!r} is not a height and width: pass two whole numbers >= 1, e.g. "
                          "--image_size=32,32.")
    if max(int(part) for part in parts) > MAX_IMAGE_SIDE:
        raise ConfigError(f"--image_size={value!r}: at most {MAX_IMAGE_SIDE} pixels a side (every staged image is "
                          "stored at that size, and models train at it); pass a smaller size, e.g. "
                          "--image_size=224,224.")
    return int(parts[0]), int(parts[1])


def _check_image_flags(args) -> None:
    """--image_size, --resize and --channels (see stage/cli.py) resize and convert an image folder only;
    normalises args.image_size to 'H,W' and args.channels to an int, as the fingerprint records them."""
    given = [f"--{flag}={getattr(args, flag)}" for flag in ("image_size", "resize", "channels")
             if getattr(args, flag) is not None]
    if given and not args.from_image_folder:
        raise ConfigError(f"{' '.join(given)} resize(s) or convert(s) the images of --from_image_folder; for the "
                          "other sources drop it (stage arrays of one shape).")
    if args.image_size is not None:
        args.image_size = ",".join(map(str, parse_image_size(args.image_size)))
    if args.resize is not None:
        if args.resize not in MODES:
            raise ConfigError(f"--resize={args.resize!r} is not a resize mode: pass one of {', '.join(MODES)} "
                              "(pad keeps the whole image and its aspect ratio).")
        if args.image_size is None:
            raise ConfigError(f"--resize={args.resize} says how to resize to --image_size, which is not given: pass "
                              "--image_size=H,W (e.g. --image_size=32,32), or drop --resize.")
    if args.channels is not None:
        if str(args.channels).strip() not in {str(count) for count in CHANNELS}:
            raise ConfigError(f"--channels={args.channels!r} is not a colour mode: pass --channels=1 (grayscale) or "
                              "--channels=3 (RGB).")
        args.channels = int(args.channels)


def _check_split_flags(args) -> None:
    """--test_fraction (0 < F < 1) splits one CSV, .npz or image folder, not sources that name their splits."""
    fraction = args.test_fraction
    if fraction is None:
        if args.seed is not None:
            raise ConfigError(f"--seed={args.seed} seeds the split of --test_fraction, which is not given: pass "
                              "--test_fraction=0.2 (say) to split one file, or drop --seed.")
        if args.from_csv and not names_splits(args.from_csv):
            raise ConfigError(f"--from_csv={args.from_csv} is one file: pass --test_fraction=0.2 (say) to split it "
                              "into train and test, or name both files: --from_csv=train=train.csv,test=test.csv.")
        return
    if not 0 < fraction < 1:
        raise ConfigError(f"--test_fraction={fraction} is out of range: it is the share of the examples held out "
                          "for testing, between 0 and 1 (exclusive), e.g. --test_fraction=0.2.")
    if args.from_tfrecord:
        raise ConfigError(f"--test_fraction={fraction} splits one CSV, .npz or image folder; --from_tfrecord names "
                          "its splits (train=GLOB,test=GLOB): drop --test_fraction.")
    if args.from_csv and names_splits(args.from_csv):
        raise ConfigError(f"--test_fraction={fraction} and --from_csv={args.from_csv} both say how to split: pass "
                          "one file (--from_csv=data.csv --test_fraction=...) or the splits' files without "
                          "--test_fraction.")
    if args.npz_keys and names_splits(args.npz_keys):
        raise ConfigError(f"--test_fraction={fraction} and --npz_keys={args.npz_keys} both say how to split: with "
                          "--test_fraction, name one pair (--npz_keys=INPUTS:LABELS), or drop --test_fraction to "
                          "use the splits' arrays.")


def _check_local_sources(args) -> None:
    """The named local files and folders exist (gs:// paths and TFRecord globs are checked when read); the messages
    are those of the readers (stage/sources.py), which check gs:// paths the same way."""
    if args.from_npz and _is_local(args.from_npz):
        if not os.path.exists(args.from_npz):
            raise ConfigError(f"--from_npz={args.from_npz!r}: no such file. Pass the path of an .npz file (np.savez).")
        if os.path.isdir(args.from_npz):
            raise ConfigError(f"--from_npz={args.from_npz!r} is a folder, not a file. Pass the path of an .npz file "
                              "(np.savez) in it.")
    elif args.from_csv:
        pairs = ([item.partition("=") for item in args.from_csv.split(",") if item.strip()]
                 if names_splits(args.from_csv) else [("", "", args.from_csv)])
        for split, _, path in pairs:
            split, path = split.strip(), path.strip()
            if _is_local(path) and (not os.path.exists(path) or os.path.isdir(path)):
                what = "a folder, not a file" if os.path.exists(path) else "no such file"
                where = f"--from_csv: {split}={path!r}" if split else f"--from_csv={path!r}"
                raise ConfigError(f"{where}: {what}. Pass an existing CSV path (local or gs://), e.g. --from_csv="
                                  "data.csv --test_fraction=0.2 or --from_csv=train=train.csv,test=test.csv.")
            header = read_local_header(path) if _is_local(path) else None
            if header:  # A --label typo, a repeated column: named now, not after TensorFlow has loaded.
                feature_columns(header, path, args.label, text=args.text, id_column=getattr(args, "id_column", None),
                                drop_columns=split_list(getattr(args, "drop_columns", None)))
    elif args.from_text_folder and _is_local(args.from_text_folder) and not os.path.isdir(args.from_text_folder):
        raise ConfigError(f"--from_text_folder={args.from_text_folder!r} is not a folder. Pass a folder with "
                          "DIR/train/<class>/*.txt and DIR/test/<class>/*.txt (or DIR/<class>/*.txt with "
                          "--test_fraction).")
    elif args.from_image_folder and _is_local(args.from_image_folder) and not os.path.isdir(args.from_image_folder):
        raise ConfigError(f"--from_image_folder={args.from_image_folder!r} is not a folder. Pass a folder with "
                          "DIR/train/<class>/*.png and DIR/test/<class>/*.png (or DIR/<class>/*.png with "
                          "--test_fraction).")


def _is_local(path: str) -> bool:
    return bool(path) and "://" not in path
