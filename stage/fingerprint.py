"""What a dataset staged from your own data was staged from: a fingerprint of its source, kept next to its
dataset_info.json (`staged_source.json`, written last), so staging the same --name again tells the same source (nothing
to do) from a different one (exit 2: --force rebuilds, or another --name keeps both).

The fingerprint is the source kind (--from_npz, --from_csv, ...), the flags that change what is staged (--npz_keys,
--label, --label_kind, --features, --id_column, --drop_columns, --image_size, --resize, --channels, and
--test_fraction with --seed, which make
the split of one file) and the contents
per split: the sha256 of the bytes of the .npz, CSV and TFRecord files (and of a text folder's files, with their
names); for an image folder (often large, perhaps on
gs://) only the names, sizes and modification times of the image files, which is cheap but takes a copy of the folder
(new modification times) for a different source (--force then stages it again). Paths are not compared (the same file,
moved, is the same source); they name the sources in messages, as does the time of staging. A training run records the
fingerprint's digest (data/staged_source.py, training/run_directory/identity.py) and refuses to resume on data staged
from another source. Everything goes through tf.io.gfile, so DATA_DIR and the sources may be gs://.
"""

import hashlib
import json

from common.errors import ConfigError
from common.storage_paths import join, relative_to
from data import staged_source

# Per source flag, the flags that change what is staged from it.
SETTINGS = {"from_npz": ("npz_keys", "label_kind", "test_fraction", "seed"),
            "from_csv": ("label", "label_kind", "test_fraction", "seed", "text", "id_column", "drop_columns"),
            "from_tfrecord": ("features", "label", "label_kind"),
            "from_image_folder": ("test_fraction", "seed", "image_size", "resize", "channels"),
            "from_text_folder": ("test_fraction", "seed")}
_CHUNK = 1 << 22


def of_source(args) -> dict:
    """The fingerprint of the one --from_* source of the parsed command line `args` (read and checked already)."""
    import tensorflow as tf

    from stage.sources import parse_split_paths

    kind = next(flag for flag in SETTINGS if getattr(args, flag))
    value = getattr(args, kind)
    if kind == "from_npz":
        contents = {"file": _sha256([value])}
    elif kind == "from_csv" and args.test_fraction is not None:
        contents = {"file": _sha256([value])}
    elif kind == "from_csv":
        contents = {split: _sha256([path]) for split, path in parse_split_paths(value, "--from_csv").items()}
    elif kind == "from_tfrecord":
        contents = {split: _sha256(sorted(tf.io.gfile.glob(pattern)))
                    for split, pattern in parse_split_paths(value, "--from_tfrecord").items()}
    elif kind == "from_text_folder":
        contents = {"files": _text_listing(value.rstrip("/"), args.test_fraction is not None)}
    else:
        contents = {"files": _image_listing(value.rstrip("/"), args.test_fraction is not None)}
    return {"source": f"--{kind}={value}", "kind": kind,
            "settings": {flag: getattr(args, flag) for flag in SETTINGS[kind]}, "contents": contents}


def write(version_dir: str, fingerprint: dict) -> None:
    """Writes `fingerprint` with the time of staging (UTC; it names the staging in messages, not compared)."""
    import datetime

    import tensorflow as tf

    staged = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    with tf.io.gfile.GFile(join(version_dir, staged_source.FILE), "w") as handle:
        handle.write(json.dumps({**fingerprint, "staged": staged}, indent=1, sort_keys=True))


def compare(version_dir: str, fingerprint: dict, name: str, data_dir: str) -> bool:
    """True when the dataset in `version_dir` was staged from this source, False when that is unknown (staged before
    fingerprints were kept); a ConfigError naming both sources and the fix when it was staged from another."""
    staged = staged_source.read(version_dir)
    if staged is None:
        return False
    differences = []
    if staged.get("kind") != fingerprint["kind"]:
        differences.append("the kind of source")
    else:
        differences += [f"--{flag} ({staged.get('settings', {}).get(flag)!r} then, {value!r} now)"
                        for flag, value in fingerprint["settings"].items()
                        if staged.get("settings", {}).get(flag) != value]
        changed = sorted(key for key in {**staged["contents"], **fingerprint["contents"]}
                         if staged["contents"].get(key) != fingerprint["contents"].get(key))
        what = {"from_npz": "the file's contents", "from_image_folder": "the image files (names, sizes or "
                "modification times)", "from_text_folder": "the text files (names or contents)"}
        what = what.get(fingerprint["kind"], "the contents of split(s) " + ", ".join(changed))
        differences += [what] if changed else []
    if not differences:
        return True
    raise ConfigError(f"--name={name!r} is already staged in {data_dir} from another source (staged: "
                      f"{staged.get('source')}; now: {fingerprint['source']}; what differs: "
                      f"{', '.join(differences)}). Pass --force to delete it and stage this source, or choose another "
                      f"--name (e.g. --name={name}_2) to keep both.")


def _sha256(paths: list[str]) -> str:
    """sha256 over the bytes of `paths`, in order (each file's own digest, so file boundaries count)."""
    import tensorflow as tf

    total = hashlib.sha256()
    for path in paths:
        digest = hashlib.sha256()
        with tf.io.gfile.GFile(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        total.update(digest.digest())
    return total.hexdigest()


def _image_listing(root: str, whole: bool) -> str:
    """sha256 of the image folder's files read by stage/images.py: split/class/name, size and mtime of each."""
    import tensorflow as tf

    from stage.images import list_images

    total = hashlib.sha256()
    for _, classes in sorted(list_images(root, whole).items()):
        for _, files in sorted(classes.items()):
            for path in files:
                stat = tf.io.gfile.stat(path)
                relative = relative_to(path, root)
                total.update(f"{relative}\t{stat.length}\t{stat.mtime_nsec}\n".encode())
    return total.hexdigest()


def _text_listing(root: str, whole: bool) -> str:
    """sha256 of the text folder's files read by stage/text_folder.py: split/class/name and contents of each."""
    from stage.text_folder import list_texts

    total = hashlib.sha256()
    for _, classes in sorted(list_texts(root, whole).items()):
        for _, files in sorted(classes.items()):
            for path in files:
                total.update(f"{relative_to(path, root)}\t{_sha256([path])}\n".encode())
    return total.hexdigest()
