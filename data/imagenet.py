"""ImageNet decoding for ResNet-50: random-resized crops for training, a central crop for evaluation, 224 x 224.

The standard recipe (Szegedy et al. 2015 crops, as in the Cloud TPU ResNet-50 reference and Goyal et al. 2017):
- training: a box covering 8%-100% of the image with aspect ratio 3/4-4/3 (at most 10 attempts, else the central
  crop below), decoded with `decode_and_crop_jpeg` (only the box's pixels are decoded: the JPEG decode dominates
  the host's work), resized to 224 x 224 and flipped left-right at random; all stateless, from the example's seed;
- evaluation: the central square of side 224/256 of the shorter edge ("resize to 256, crop 224"), resized to 224.
Both return float32 pixels in [0, 255]; DatasetSpec.preprocess scales and standardises them. TFDS's imagenet2012
stores every image as JPEG (it converts the few PNG and CMYK originals), which `decode_and_crop_jpeg` needs.
"""

import tensorflow as tf

IMAGE_SIZE = 224
CROP_PADDING = 32  # Evaluation crops 224 of 224 + 32 = 256.


def train_decoder(encoded: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """JPEG bytes -> a random-resized, randomly flipped 224 x 224 x 3 crop (float32, 0-255)."""
    box_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
    shape = tf.image.extract_jpeg_shape(encoded)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]), seed=box_seed,
        min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    offset_y, offset_x, _ = tf.unstack(begin)
    height, width, _ = tf.unstack(size)
    # No box found in 10 attempts: the sampler returns the whole image; use the evaluation crop instead.
    found = tf.logical_not(tf.reduce_all(tf.equal(size[:2], shape[:2])))
    image = tf.cond(
        found,
        lambda: _resize(tf.image.decode_and_crop_jpeg(encoded, tf.stack([offset_y, offset_x, height, width]),
                                                      channels=3)),
        lambda: eval_decoder(encoded))
    return tf.image.stateless_random_flip_left_right(image, seed=flip_seed)


def eval_decoder(encoded: tf.Tensor) -> tf.Tensor:
    """JPEG bytes -> the central crop (224/256 of the shorter edge), resized to 224 x 224 x 3 (float32, 0-255)."""
    shape = tf.image.extract_jpeg_shape(encoded)
    height, width = shape[0], shape[1]
    crop = tf.cast(IMAGE_SIZE / (IMAGE_SIZE + CROP_PADDING) * tf.cast(tf.minimum(height, width), tf.float32),
                   tf.int32)
    crop = tf.maximum(crop, 1)
    window = tf.stack([(height - crop + 1) // 2, (width - crop + 1) // 2, crop, crop])
    return _resize(tf.image.decode_and_crop_jpeg(encoded, window, channels=3))


def _resize(image: tf.Tensor) -> tf.Tensor:
    image = tf.image.resize(image, [IMAGE_SIZE, IMAGE_SIZE], method="bilinear")
    return tf.ensure_shape(image, [IMAGE_SIZE, IMAGE_SIZE, 3])
