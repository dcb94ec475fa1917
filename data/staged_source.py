"""The record of where a staged dataset came from (`staged_source.json`, written by `python -m stage` beside the
dataset's files: stage/fingerprint.py), as the core reads it: a training run records its digest in
run_identity.json and refuses to resume on the dataset staged again from another source
(training/run_directory/identity.py). Here, not in stage/, so that a fork without the staging extra still
checks data staged elsewhere."""

import hashlib
import json

from common.storage_paths import join

FILE = "staged_source.json"


def read(version_dir: str) -> dict | None:
    """The fingerprint kept in `version_dir`; None when there is none (staged before fingerprints were kept, or by a
    TFDS builder) or it cannot be read (cut short, edited): then nothing can be compared."""
    import tensorflow as tf

    path = join(version_dir, FILE)
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path) as handle:
            staged = json.loads(handle.read())
    except ValueError:
        return None
    return staged if isinstance(staged, dict) and isinstance(staged.get("contents"), dict) else None


def digest(fingerprint: dict) -> str:
    """A short digest of what `fingerprint` says was staged (kind, settings, contents; not paths or times), which a
    training run records in run_identity.json to refuse resuming on other data (training/run_directory/identity.py)."""
    staged = {key: fingerprint.get(key) for key in ("kind", "settings", "contents")}
    return hashlib.sha256(json.dumps(staged, sort_keys=True).encode()).hexdigest()[:16]
