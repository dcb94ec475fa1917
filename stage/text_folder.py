"""A text folder, one sub-folder per split and per class (`DIR/train/<class>/*.txt`, `DIR/test/<class>/*.txt`; or
`DIR/<class>/*.txt` with --test_fraction), one example per file: read into one string per example with class ids.
The layout is that of an image folder (stage/images.py); the class names are the sorted sub-folder names of all
splits. Files must be UTF-8 text (a byte-order mark is dropped); a file that is not, or a class folder with no .txt
file, is a ConfigError naming it, before anything is written.
"""

import numpy as np

from common.errors import ConfigError
from common.storage_paths import join, list_folder
from stage import utf8_text
from stage.class_folders import checked_class_names

TEXT_EXTENSIONS = (".txt",)
_LAYOUT = "DIR/train/<class>/*.txt and DIR/test/<class>/*.txt (or DIR/<class>/*.txt with --test_fraction)"


def list_texts(root: str, whole: bool = False) -> dict[str, dict[str, list[str]]]:
    """{split: {class: sorted .txt paths}} of the folder `root`; when `whole` (--test_fraction splits it) the class
    folders are directly in `root`: one split, 'all'."""
    import tensorflow as tf

    if not tf.io.gfile.isdir(root):
        raise ConfigError(f"--from_text_folder={root!r} is not a folder. Pass a folder with {_LAYOUT}.")
    folders = list_folder(root).folders
    if whole:
        named = sorted({"train", "test", "validation"} & set(folders))
        if named:
            raise ConfigError(f"--from_text_folder={root!r} has the split folder(s) {named}, and --test_fraction "
                              "splits class folders (DIR/<class>/*.txt): drop --test_fraction to use its splits.")
        splits = {"all": root}
    else:
        if "train" not in folders or not {"test", "validation"} & set(folders):
            raise ConfigError(f"--from_text_folder={root!r} has the sub-folders {sorted(folders)}, not the splits "
                              "train and test (or validation): put the files in DIR/train/<class>/ and "
                              "DIR/test/<class>/, or, for class folders directly in DIR, pass --test_fraction=0.2 "
                              "(say) to split them.")
        splits = {split: join(root, split) for split in folders}
    listing = {}
    for split, folder in splits.items():
        listing[split] = {}
        for name in list_folder(folder).folders:
            listing[split][name] = [join(folder, name, file) for file in list_folder(join(folder, name)).files
                                    if file.lower().endswith(TEXT_EXTENSIONS)]
    return listing


def read_text_folder(root: str, whole: bool = False) -> tuple[dict, list[str]]:
    """({split: (texts [N] str, class ids [N])}, class names) of the folder `root` (see list_texts)."""
    listing = list_texts(root, whole)
    class_names = checked_class_names(listing, root, whole, flag="--from_text_folder", no_files="no .txt files",
                                      fix="Put its texts in (one example per .txt file), or remove the folder.")
    splits = {}
    for split, classes in listing.items():
        texts, labels = [], []
        for name, files in classes.items():
            for path in files:
                texts.append(_read_text(path))
                labels.append(class_names.index(name))
        splits[split] = (np.asarray(texts, dtype=object), np.asarray(labels, np.int64))
    return splits, class_names


def _read_text(path: str) -> str:
    """The UTF-8 text of the file `path`; a ConfigError naming it (and the first bad byte) when it is not UTF-8."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as handle:
        return utf8_text.decode(handle.read(), named=f"--from_text_folder: {path}",
                                  not_utf8_fix=f"convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8 {path}), or "
                                               "remove it.",
                                  binary_fix="file (a binary or compressed file?): remove it, or save it as UTF-8 "
                                             "text.")
