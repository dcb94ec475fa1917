"""An image folder, one sub-folder per split and per class (`DIR/train/<class>/*.png`, `DIR/test/<class>/*.png`),
read into uint8 arrays with class ids; the layout is TFDS's `ImageFolder`'s, and the class names are the sorted
sub-folder names of all splits (as ImageFolder orders them). Every image must have the same shape.
"""

import numpy as np

from common.errors import ConfigError
from common.storage_paths import join, list_folder
from data.stage.class_folders import checked_class_names

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


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
            listing[split][name] = [join(folder, file) for file in list_folder(folder).files
                                    if file.lower().endswith(IMAGE_EXTENSIONS)]
    return listing


def read_image_folder(root: str, whole: bool = False) -> tuple[dict, list[str]]:
    """({split: (images uint8 [N, H, W, C], class ids [N])}, class names) of the folder `root` (see list_images)."""
    import tensorflow as tf

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
                    raise ConfigError(f"{path} is not a readable image ({error.message.splitlines()[0]}); remove "
                                      "it.") from None
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
        fixes.append("resize them to one size")
    if shape[2] != first_shape[2]:
        fixes.append(f"convert them to one colour mode (the first is {modes.get(shape[2], shape[2])}, the second "
                     f"{modes.get(first_shape[2], first_shape[2])}; e.g. all RGB: PIL's "
                     "Image.open(f).convert('RGB').save(f))")
    fix = " and ".join(fixes)
    return f"Images of different shapes: {path} is {shape}, {first_path} is {first_shape}. {fix[0].upper()}{fix[1:]}."
