"""Temporary files a killed run left in model_dir, removed when the next run starts.

Every write that must never be seen half-done goes to a temporary name first and is then moved into place. A SIGKILL
(or a VM that goes away) in between leaves the temporary behind; on gs://, where a move is a copy then a delete, that
window lasts seconds. The next run's chief, holding the run lock (so no other run is writing them), removes exactly
these, and nothing else:

  export/.<name>.tmp-<8 hex>/         a SavedModel being written (training/run_directory/export.py)
  checkpoints/ and best/:
    ckpt-<step>_temp.../              a checkpoint save TensorFlow had not yet merged into place
    checkpoint.tmp<32 hex>            the checkpoint state file being rewritten (TensorFlow's atomic write)
  model_dir/ and best/: .<name>.tmp   a small file being written (training/run_directory/layout.py)
  model_dir/.write-probe-<32 hex>     the bucket's write check (gcs/bucket_checks.py)
  on gs://, every object below model_dir whose name holds '//': written by versions before this module existed,
    which joined listing entries with f"{folder}/{name}"; Cloud Storage keeps 'a//b' apart from 'a/b', so they are
    stray copies nothing reads.
"""

import logging
import re

import tensorflow as tf

from common.storage_errors import describe
from common.storage_paths import files_under, has_empty_segment, join, list_folder
from training.run_directory.export import TEMPORARY as EXPORT_TEMPORARY
from training.run_directory.layout import BEST, CHECKPOINTS, EXPORT

log = logging.getLogger(__name__)

CHECKPOINT_TEMPORARY = re.compile(r"^ckpt-\d+_temp(_[0-9a-f]+)?$")  # TensorFlow's sharded save: '_temp/part-...'.
STATE_TEMPORARY = re.compile(r"^checkpoint\.tmp[0-9a-f]{32}$")
SMALL_FILE_TEMPORARY = re.compile(r"^\..+\.tmp$")  # training/run_directory/layout.py's temporary_name().
WRITE_PROBE = re.compile(r"^\.write-probe-[0-9a-f]{32}$")

# Folder below model_dir -> (patterns of the sub-folders to remove, patterns of the files to remove).
_FOLDERS = {
    "": ((), (SMALL_FILE_TEMPORARY, WRITE_PROBE)),
    EXPORT: ((EXPORT_TEMPORARY,), ()),
    CHECKPOINTS: ((CHECKPOINT_TEMPORARY,), (STATE_TEMPORARY,)),
    BEST: ((CHECKPOINT_TEMPORARY,), (STATE_TEMPORARY, SMALL_FILE_TEMPORARY)),
}


def remove_leftovers(model_dir: str) -> list[str]:
    """Removes what the module docstring lists from `model_dir` (local or gs://); returns the paths removed. A
    removal that fails is a warning: the leftovers are harmless to the run, and storage trouble is reported by the
    checkpoint restore that follows."""
    removed = []
    for folder, (folder_patterns, file_patterns) in _FOLDERS.items():
        path = join(model_dir, folder)
        try:
            listing = list_folder(path)
        except tf.errors.NotFoundError:
            continue
        except tf.errors.OpError as error:
            log.warning("Could not list %s for temporary files of a killed run (%s).", path, describe(error, 200))
            continue
        for name in listing.folders:
            if any(pattern.match(name) for pattern in folder_patterns):
                removed += _remove(join(path, name), tf.io.gfile.rmtree)
        for name in listing.files:
            if any(pattern.match(name) for pattern in file_patterns):
                removed += _remove(join(path, name), tf.io.gfile.remove)
    if model_dir.startswith("gs://") and not has_empty_segment(model_dir):
        try:
            stray = [path for path in files_under(model_dir) if has_empty_segment(path)]
        except tf.errors.OpError as error:
            log.warning("Could not list %s for stray '//' objects (%s).", model_dir, describe(error, 200))
            stray = []
        for path in stray:
            removed += _remove(path, tf.io.gfile.remove)  # The exact name as listed: never rebuilt with join.
    if removed:
        shown = ", ".join(removed[:5]) + (f" and {len(removed) - 5} more" if len(removed) > 5 else "")
        log.info("Removed %d temporary file(s) a killed run left in %s: %s.", len(removed), model_dir, shown)
    return removed


def _remove(path: str, remove) -> list[str]:
    try:
        remove(path)
    except tf.errors.NotFoundError:
        return []
    except tf.errors.OpError as error:
        log.warning("Could not remove %s, left by a killed run (%s).", path, describe(error, 200))
        return []
    return [path]
