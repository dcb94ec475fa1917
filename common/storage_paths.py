"""Paths on local disks and gs://, built from parts and from folder listings, never with a '//' the code did not
find in storage.

Why this is one module: on Cloud Storage a folder is only a prefix of object names, and names are exact: 'a//b'
and 'a/b' are two objects (the first almost never exists). TensorFlow's gs:// listings name sub-folders with a
trailing slash (`tf.io.gfile.listdir` gives ['variables/'], `tf.io.gfile.walk` yields 'gs://b/x/variables/'), so
`f"{folder}/{name}"` on a listing builds 'variables//x' and reads or writes an object that is not there. Local
filesystems read 'a//b' as 'a/b', which hides that bug everywhere but on Cloud Storage. So: build paths with
`join`, turn listing entries into paths with `entry_path`, and list folders only through `list_folder` and
`files_under` (tests/test_layout.py checks that nothing else in the product lists a folder).
"""

import dataclasses


def join(base: str, *parts: str) -> str:
    """`base` then each part, with exactly one '/' between them whatever slashes they end or start with; empty parts
    are skipped. Unlike os.path.join, a part starting with '/' does not replace what came before (on gs:// there is
    no root to go back to). `base` is kept as given apart from its trailing slashes ('gs://b/run/' -> 'gs://b/run')."""
    path = base if base.endswith("://") or set(base) <= {"/"} else base.rstrip("/")
    for part in parts:
        part = "/".join(piece for piece in part.split("/") if piece)  # Also no '//' inside a part.
        if part:
            path = f"{path}{part}" if not path or path.endswith("/") else f"{path}/{part}"
    return path


def entry_path(folder: str, entry: str) -> str:
    """The exact path of `entry`, an item of `tf.io.gfile.listdir(folder)` (a sub-folder ends with '/' on gs://):
    nothing is added or removed but the one separator `folder` lacks. An entry '/' is the sub-folder with an empty
    name that an object named 'folder//x' implies on gs://."""
    return f"{folder}{entry}" if folder.endswith("/") else f"{folder}/{entry}"


def relative_to(path: str, root: str) -> str:
    """`path` below `root` ('gs://b/x/variables/v', 'gs://b/x' -> 'variables/v'); a ValueError if it is not below."""
    prefix = root if root.endswith("/") else root + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not below {root}")
    return path[len(prefix):]


@dataclasses.dataclass(frozen=True)
class Listing:
    """The names in one folder: sub-folders (without the trailing '/') and files, each sorted."""

    folders: list[str]
    files: list[str]


def list_folder(folder: str) -> Listing:
    """The sub-folders and files directly in `folder` (local or gs://); a tf.errors.NotFoundError if it does not exist.
    On gs:// a sub-folder is told by the '/' its listing entry ends with (no request per entry); elsewhere by
    `isdir`. The empty-named sub-folder of a 'folder//x' object is not listed: see `files_under`."""
    import tensorflow as tf

    entries = tf.io.gfile.listdir(folder)
    if folder.startswith("gs://"):
        folders = [entry.rstrip("/") for entry in entries if entry.endswith("/") and entry != "/"]
        files = [entry for entry in entries if not entry.endswith("/")]
    else:
        folders = [entry for entry in entries if tf.io.gfile.isdir(entry_path(folder, entry))]
        files = sorted(set(entries) - set(folders))
    return Listing(sorted(folders), sorted(files))


def files_under(root: str) -> list[str]:
    """The exact path of every file below folder `root`, at any depth, sorted; [] if `root` does not exist. On gs://
    one listing per folder, and objects whose names hold '//' are found as they are named (to be removed)."""
    import tensorflow as tf

    if not root.startswith("gs://"):
        if not tf.io.gfile.isdir(root):
            return []
        return sorted(entry_path(folder, name) for folder, _, names in tf.io.gfile.walk(root) for name in names)
    found, folders = [], [root]
    while folders:
        folder = folders.pop()
        try:
            entries = tf.io.gfile.listdir(folder)
        except tf.errors.NotFoundError:
            continue
        for entry in entries:
            (folders if entry.endswith("/") else found).append(entry_path(folder, entry))
    return sorted(found)


def has_empty_segment(path: str) -> bool:
    """Whether the URL `path` holds '//' after its scheme ('gs://b/a//x': an object GCS keeps apart from 'a/x').
    False for paths without a scheme: local filesystems read 'a//b' as 'a/b'."""
    return "://" in path and "//" in path.partition("://")[2]
