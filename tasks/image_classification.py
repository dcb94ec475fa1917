"""Image classification: an image feature and an integer label (digits, MNIST, CIFAR-10, ImageNet)."""

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tasks.base import ClassificationTask, classification_outputs, label_names
from tasks.image_resize import resize_image


@dataclasses.dataclass(frozen=True)
class ImageClassification(ClassificationTask):
    """Raw pixels -> /max_pixel_value -> standardised per channel; optional stateless augmentation."""

    augmentations = ("flip_and_crop", "randaugment", "mixup", "cutmix")  # experiment.augmentation may name these.

    num_classes: int = 0
    image_shape: tuple[int, int, int] = (0, 0, 0)
    max_pixel_value: float = 255.0  # Raw pixel values are scaled by this to [0, 1] ...
    mean: tuple[float, ...] = (0.0,)  # ... then standardised per channel with mean and std.
    std: tuple[float, ...] = (1.0,)
    image_key: str = "image"
    # Optional augmentation (image, stateless seed [2]) -> image; a pure function of its arguments, so the data are
    # the same for a given SEED and step at any replica count and on resume.
    augment: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None = None
    # Optional decoders from the encoded image (e.g. JPEG bytes) straight to `image_shape` raw pixels, for datasets
    # whose images vary in size: (encoded, seed) -> image for training, (encoded) -> image for eval. None: TFDS's
    # own decoding (the stored images already have `image_shape`). With both a train_decoder and augment, derive
    # independent seeds with stateless_split.
    train_decoder: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None = None
    eval_decoder: Callable[[tf.Tensor], tf.Tensor] | None = None
    class_names: tuple[str, ...] | None = None  # From the dataset's ClassLabel (bind).
    # (H, W, mode) when the images were resized at staging (python -m stage --image_size=H,W --resize=MODE;
    # data/staged_spec.py reads it): the export then takes uint8 images of any H x W (C channels, one size per
    # request) and resizes them in its graph with the same function (tasks/image_resize.py). None: exactly
    # image_shape.
    serving_resize: tuple[int, int, str] | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return self.image_key, self.label_key

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.image_shape)

    @property
    def output_size(self) -> int:
        return self.num_classes

    def stored_shapes(self):
        # Own decoders read images of any size (ImageNet's JPEGs); otherwise they are stored at `image_shape`.
        return {} if self.train_decoder or self.eval_decoder else {self.image_key: tuple(self.image_shape)}

    def decoders(self, features):
        # Images of a fixed size are decoded once, when the split is read; variable-size ones (own decoders: ImageNet's
        # JPEGs) stay compressed and are decoded per drawn example, straight to the crop.
        if self.train_decoder is not None or self.eval_decoder is not None:
            return {self.image_key: tfds.decode.SkipDecoding()}
        return {}

    def bind(self, builder):
        return dataclasses.replace(self, class_names=label_names(builder, self.label_key))

    def preprocess(self, images: tf.Tensor) -> tf.Tensor:
        """Raw images (any int dtype, [..., H, W, C]) -> standardised float32; one image or a batch."""
        # Multiplications by float32 reciprocals: Grappler rewrites a division by a constant into one in some graphs
        # and not others, so the batches drawn on the device (data/device_split.py) and by tf.data would differ.
        scale = np.float32(1.0) / np.asarray(self.std, np.float32) / np.float32(self.max_pixel_value)
        offset = np.asarray(self.mean, np.float32) / np.asarray(self.std, np.float32)
        return tf.cast(images, tf.float32) * tf.constant(scale) - tf.constant(offset)

    def prepare(self, example, features, *, seed=None):
        image = example[self.image_key]
        if seed is not None and self.train_decoder is not None:
            image = self.train_decoder(image, seed)
        elif self.eval_decoder is not None:
            image = self.eval_decoder(image)
        elif image.dtype == tf.string:  # Still encoded (read with SkipDecoding).
            image = features[self.image_key].decode_example(image)
        image = self.preprocess(image)
        if seed is not None and self.augment is not None:
            image = self.augment(image, seed)
        return tf.ensure_shape(image, self.image_shape), example[self.label_key]

    def prepare_batch(self, examples, features, *, seeds):
        images = examples[self.image_key]
        if self.train_decoder is not None or images.dtype == tf.string:
            return super().prepare_batch(examples, features, seeds=seeds)
        images = self.preprocess(images)  # Decoded already: one vectorised op for the batch.
        if self.augment is not None:  # Stateless per example (keyed by its position), so per example.
            images = tf.map_fn(lambda args: self.augment(*args), (images, seeds),
                               fn_output_signature=tf.TensorSpec(self.image_shape, tf.float32))
        return tf.ensure_shape(images, [None, *self.image_shape]), examples[self.label_key]

    def serving_signature(self):
        shape = [None, None, None, self.image_shape[-1]] if self.serving_resize else [None, *self.image_shape]
        return {"images": tf.TensorSpec(shape, tf.uint8, name="images")}

    def serve(self, model, inputs):
        images = inputs["images"]
        if self.serving_resize:  # The staging's resize, to the uint8 pixels it stored (an H x W image is unchanged).
            height, width, mode = self.serving_resize
            images = resize_image(images, (height, width), mode)
        # An empty request gets an empty answer: TensorFlow's oneDNN Conv2D returns its input's shape for an empty
        # batch (then "Incompatible shapes: [64] vs. [0,4,4,32]" in the next layer), so the model runs on one zero
        # image appended to an empty batch (none to a non-empty one: the same result) and answers the real count.
        count = tf.shape(images)[0]
        inputs = self.preprocess(images)
        padded = tf.pad(inputs, [[0, tf.maximum(1 - count, 0)]] + [[0, 0]] * (len(inputs.shape) - 1))
        inputs = tf.reshape(padded, [-1, *inputs.shape[1:]])  # The image shape, which tf.pad loses (LiteRT needs it).
        return classification_outputs(model(inputs, training=False)[:count], self.class_names)

    def serving_example(self, example, features):
        image = example[self.image_key]
        if self.eval_decoder is not None:  # The evaluation crop: what the model was evaluated on, at image_shape.
            image = self.eval_decoder(image)
        elif image.dtype == tf.string:
            image = features[self.image_key].decode_example(image)
        if image.dtype.is_floating:  # A decoder that resizes returns float pixels.
            image = tf.round(image)
        return {"images": tf.saturate_cast(image, tf.uint8)}

    def serving_metadata(self):
        class_names = list(self.class_names) if self.class_names else None
        resize = ({"image_size": list(self.serving_resize[:2]), "mode": self.serving_resize[2]}
                  if self.serving_resize else None)
        return {**super().serving_metadata(), "class_names": class_names, "max_pixel_value": self.max_pixel_value,
                **({"resize": resize} if resize else {})}
