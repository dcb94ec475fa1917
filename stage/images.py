"""An image folder, one sub-folder per split and per class (`DIR/train/<class>/*.png`, `DIR/test/<class>/*.png`),
read into uint8 arrays with class ids; the layout is TFDS's `ImageFolder`'s, and the class names are the sorted
sub-folder names of all splits (as ImageFolder orders them). Every image must have the same shape, unless
`--image_size=H,W` resizes each (by `--resize`: pad, crop or stretch; tasks/image_resize.py, which the export's
serving graph applies too) and `--channels=1|3` converts each to grayscale or RGB (alpha dropped) first.
"""

import logging
import re

import numpy as np

from common.errors import ConfigError
from common.storage_paths import join, list_folder
from stage.class_folders import checked_class_names

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
log = logging.getLogger(__name__)


def _decode_error(error) -> str:
    """TensorFlow's decode error without its graph-node prefix and op suffix: 'Invalid PNG data, size 100'."""
    text = re.sub(r"^\{\{.*?\}\}\s*", "", error.message.splitlines()[0])
    return re.sub(r"\s*\[Op:.*$", "", text)


def list_images(root: str, whole: bool = False) -> dict[str, dict[str, list[str]]]:
    """{split: {class: sorted image paths}} of the folder `root`: the files read_image_folder reads. When `whole`
    (--test_fraction splits it) the class folders are directly in `root`: one split, 'all'."""
    import tensorflow as tf

    if not tf.io.gfile.isdir(root):
        raise ConfigError(f"--from_image_folder={root!r} is not a folder. Pass a folder with DIR/train/<class>/*.png "
                          "and DIR/test/<class>/*.png (or DIR/<class>/*.png with --test_fraction).")
    folders = list_folder(root).folders
    if whole:
        named = sorted({"train", "test", "validation"} & set(folders))
        if named:
            raise ConfigError(f"--from_image_folder={root!r} has the split folder(s) {named}, and --test_fraction "
                              "splits class folders (DIR/<class>/*.png): drop --test_fraction to use its splits.")
        listing = {"all": {}}
    else:
        listing = {split: {} for split in folders}
        if "train" not in listing or not {"test", "validation"} & set(listing):
            raise ConfigError(f"--from_image_folder={root!r} has the sub-folders {sorted(listing)}, not the splits "
                              "train and test (or validation): put the images in DIR/train/<class>/ and "
                              "DIR/test/<class>/, or, for class folders directly in DIR, pass --test_fraction=0.2 "
                              "(say) to split them.")
    for split in listing:
        for name in list_folder(root if whole else join(root, split)).folders:
            folder = root if whole else join(root, split)
            folder = join(folder, name)
            files = list_folder(folder).files
            listing[split][name] = [join(folder, file) for file in files if file.lower().endswith(IMAGE_EXTENSIONS)]
            skipped = [file for file in files if not file.lower().endswith(IMAGE_EXTENSIONS)]
            if skipped:
                log.warning("--from_image_folder: skipped %d file(s) of %s that are not %s images (e.g. %s).",
                            len(skipped), folder, "/".join(IMAGE_EXTENSIONS), skipped[0])
    return listing


def read_image_folder(root: str, whole: bool = False, image_size: tuple[int, int] | None = None,
                      resize: str | None = None, channels: int | None = None) -> tuple[dict, list[str]]:
    """({split: (images uint8 [N, H, W, C], class ids [N])}, class names) of the folder `root` (see list_images);
    each image converted to `channels` and resized to `image_size` by `resize` when given (the module docstring)."""
    import tensorflow as tf

    from tasks.image_resize import DEFAULT_MODE, convert_channels, resize_image

    listing = list_images(root, whole)
    class_names = checked_class_names(listing, root, whole, flag="--from_image_folder",
                                      no_files=f"no {'/'.join(IMAGE_EXTENSIONS)} images",
                                      fix="Put its images in, or remove the folder.")
    splits, shapes = {}, {}
    for split, classes in listing.items():
        images, labels = [], []
        for name, files in classes.items():
            for path in files:
                try:
                    image = tf.io.decode_image(tf.io.read_file(path), expand_animations=False).numpy()
                except tf.errors.InvalidArgumentError as error:
                    raise ConfigError(f"{path} is not a readable image ({_decode_error(error)}); remove it.") \
                        from None
                if channels is not None:
                    image = convert_channels(image, channels)
                if image_size is not None:
                    image = resize_image(image, image_size, resize or DEFAULT_MODE).numpy()
                image = np.asarray(image)
                shapes.setdefault(image.shape, path)
                if len(shapes) > 1:
                    raise ConfigError(_mixed_shapes(path, image.shape, *next(iter(shapes.items()))[::-1]))
                images.append(image)
                labels.append(class_names.index(name))
        if not images:
            raise ConfigError(f"--from_image_folder: {root}/{split} has no {'/'.join(IMAGE_EXTENSIONS)} images in "
                              "class sub-folders.")
        splits[split] = (np.stack(images).astype(np.uint8), np.asarray(labels, np.int64))
    return splits, class_names


def _mixed_shapes(path: str, shape: tuple, first_path: str, first_shape: tuple) -> str:
    """What differs between two images' shapes (H, W, C) and how to fix it: the size (resize) and/or the colour mode
    (C: 1 grayscale, 2 grayscale + alpha, 3 RGB, 4 RGBA; convert)."""
    modes = {1: "grayscale", 2: "grayscale with alpha", 3: "RGB", 4: "RGBA"}
    fixes = []
    if shape[:2] != first_shape[:2]:
        fixes.append("resize them to one size: pass --image_size=H,W (e.g. --image_size=32,32; --resize=pad, crop "
                     "or stretch says how, default pad) and the export resizes a client's images the same way")
    if shape[2] != first_shape[2]:
        fixes.append(f"convert them to one colour mode (the first is {modes.get(shape[2], shape[2])}, the second "
                     f"{modes.get(first_shape[2], first_shape[2])}): pass --channels=3 (RGB) or --channels=1 "
                     "(grayscale; alpha is dropped)")
    fix = "; and ".join(fixes)
    return f"Images of different shapes: {path} is {shape}, {first_path} is {first_shape}. {fix[0].upper()}{fix[1:]}."
