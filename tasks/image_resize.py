"""One resize of images to a fixed H x W, used both where images are staged (`python -m stage --image_size=H,W
--resize=MODE --channels=C`, stage/images.py) and inside an export's serving graph
(tasks/image_classification.py, `serving_resize`): the same function on the same pixels gives the same uint8 result
bit for bit, so a client sends the picture it has and the model sees what it was trained on.

Modes (`pad` is the default: nothing is cut off and nothing is distorted):
- pad: keep the aspect ratio, fit inside H x W (bilinear), zero-pad the rest, centred (tf.image.resize_with_pad);
- crop: keep the aspect ratio, cover H x W: the largest centred window of the target's aspect ratio, resized
  (bilinear) to H x W (as keras.ops.image's smart_resize; the window is computed in integers);
- stretch: resize (bilinear) to H x W, changing the aspect ratio.
The float result is rounded half to even and saturate-cast to uint8, as the staged PNGs store it. An image already
H x W comes back unchanged in every mode (a bilinear resize to its own size samples the pixels themselves), so a
staged image sent to the export gives the same result as the picture it was resized from.
TensorFlow is imported in the functions: stage/flag_checks.py reads MODES before it is loaded.
"""

MODES = ("pad", "crop", "stretch")
DEFAULT_MODE = "pad"
CHANNELS = (1, 3)  # --channels: grayscale or RGB.


def resize_image(image, size: tuple[int, int], mode: str = DEFAULT_MODE):
    """`image` (uint8, [H0, W0, C] or a batch [N, H0, W0, C], any H0, W0) resized to `size` (H, W) by `mode`;
    uint8 of the same rank."""
    import tensorflow as tf

    if mode not in MODES:
        raise ValueError(f"resize mode {mode!r} is not one of {MODES}")
    height, width = int(size[0]), int(size[1])
    # Resized as float32 (the resize kernels compute in float32 from uint8 too: the same pixels) and clipped with
    # maximum and minimum rather than saturate_cast's ClipByValue: LiteRT's builtin ops take these (its
    # RESIZE_BILINEAR has no uint8-in, float-out form), so an export that resizes also converts to model.tflite.
    image = tf.cast(tf.convert_to_tensor(image), tf.float32)
    if mode == "stretch":
        resized = tf.image.resize(image, (height, width), method="bilinear")
    elif mode == "pad":
        resized = tf.image.resize_with_pad(image, height, width, method="bilinear")
    else:
        shape = tf.shape(image)
        source_height, source_width = shape[-3], shape[-2]
        # The window of aspect height:width inside the source: as tall as the source unless that is too wide.
        crop_height = tf.maximum(tf.minimum(source_height, source_width * height // width), 1)
        crop_width = tf.maximum(tf.minimum(source_width, source_height * width // height), 1)
        top, left = (source_height - crop_height) // 2, (source_width - crop_width) // 2
        window = image[..., top:top + crop_height, left:left + crop_width, :]
        resized = tf.image.resize(window, (height, width), method="bilinear")
    return tf.cast(tf.minimum(tf.maximum(tf.round(resized), 0.0), 255.0), tf.uint8)


def convert_channels(image, channels: int):
    """uint8 `image` ([..., C], C = 1 grayscale, 2 grayscale + alpha, 3 RGB, 4 RGBA) as `channels` (1 or 3): the
    alpha channel dropped, then RGB -> grayscale (tf.image.rgb_to_grayscale's weights) or grayscale -> RGB."""
    import tensorflow as tf

    image = tf.convert_to_tensor(image)
    present = image.shape[-1]
    if present in (2, 4):
        image = image[..., :present - 1]
        present -= 1
    if present == channels:
        return image
    if channels == 1:
        return tf.image.rgb_to_grayscale(image)
    return tf.image.grayscale_to_rgb(image)
