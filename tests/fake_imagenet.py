"""A tiny stand-in for ImageNet's manual download, so TFDS's real imagenet2012 builder can run here.

ImageNet cannot be downloaded (registration, ~150 GB). `write_manual_dir` writes the two tar files TFDS's builder
reads, in their real layout: ILSVRC2012_img_train.tar holds one tar per class (n01440764.tar, ...) of JPEGs named
<class>_<n>.JPEG; ILSVRC2012_img_val.tar holds ILSVRC2012_val_<8 digits>.JPEG, labelled by TFDS's own
validation_labels.txt in file-name order. The JPEGs are random noise of varied sizes and aspect ratios, so the
crops, resizes and static shapes of data/imagenet.py are exercised; nothing here is learnable.

`oddities=True` adds what the real archives hold and plain noise JPEGs do not: a grayscale JPEG (train and
validation), a CMYK JPEG under the name of one of the real CMYK originals, and PNG bytes under the name of the real
PNG-as-JPEG (TFDS's builder converts those two by name), each in its real class (n01739381, n02105855).
"""

import io
import os
import tarfile

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds


def _jpeg(rng: np.random.Generator, size: tuple[int, int] | None) -> bytes:
    if size is None:
        height, width = int(rng.integers(40, 120)), int(rng.integers(40, 120))
    else:  # Around `size`, +-20%.
        height, width = (int(side * rng.uniform(0.8, 1.2)) for side in size)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return tf.io.encode_jpeg(pixels, quality=80).numpy()


def _odd_images(rng: np.random.Generator) -> dict[str, dict[str, bytes]]:
    """{synset: {file name: bytes}} of the real archives' oddities (see the module docstring)."""
    from PIL import Image  # Pillow: only here, for the CMYK JPEG (TensorFlow cannot encode one).

    cmyk = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (50, 70, 4), dtype=np.uint8), mode="CMYK").save(cmyk, "JPEG")
    gray = tf.io.encode_jpeg(rng.integers(0, 256, (60, 45, 1), dtype=np.uint8)).numpy()
    png = tf.io.encode_png(rng.integers(0, 256, (40, 80, 3), dtype=np.uint8)).numpy()
    return {"n01739381": {"n01739381_1309.JPEG": cmyk.getvalue(), "n01739381_gray.JPEG": gray},
            "n02105855": {"n02105855_2933.JPEG": png}}


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def write_manual_dir(path: str, *, classes: int = 6, per_class: int = 10, validation: int = 20,
                     seed: int = 0, size: tuple[int, int] | None = None, oddities: bool = False) -> str:
    """Writes ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar into `path`; returns `path`. Images are 40-120
    pixels a side, or around `size` (height, width); `oddities` adds the real archives' odd files."""
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    synsets = tfds.core.tfds_path("datasets/imagenet2012/labels.txt").read_text().split()[:classes]
    files = {synset: {f"{synset}_{index}.JPEG": _jpeg(rng, size) for index in range(per_class)} for synset in synsets}
    validation_files = [_jpeg(rng, size) for _ in range(validation)]
    if oddities:
        for synset, odd in _odd_images(rng).items():
            files.setdefault(synset, {}).update(odd)
        validation_files[0] = tf.io.encode_jpeg(rng.integers(0, 256, (50, 50, 1), dtype=np.uint8)).numpy()
    with tarfile.open(os.path.join(path, "ILSVRC2012_img_train.tar"), "w") as train:
        for synset, images in sorted(files.items()):
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w") as class_tar:
                for name, data in images.items():
                    _add(class_tar, name, data)
            _add(train, f"{synset}.tar", inner.getvalue())
    with tarfile.open(os.path.join(path, "ILSVRC2012_img_val.tar"), "w") as val:
        for index, data in enumerate(validation_files, start=1):
            _add(val, f"ILSVRC2012_val_{index:08d}.JPEG", data)
    return path


def prepare_fake_imagenet(data_dir: str, manual_dir: str, *, num_shards: int | None = None,
                          **tar_options) -> tfds.core.DatasetBuilder:
    """TFDS's real imagenet2012 builder run on the fake tar files (`tar_options` as in write_manual_dir), into
    `data_dir` (local or gs://)."""
    write_manual_dir(manual_dir, **tar_options)
    builder = tfds.builder("imagenet2012", data_dir=data_dir)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir,
                                                                                num_shards=num_shards))
    return builder
