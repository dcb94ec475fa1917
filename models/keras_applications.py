"""A keras.applications backbone by name (`MODEL='keras_application'`), its weights from a file, a new head.

    task's standardised pixels -> [0, 255] RGB -> resized to `input_size` -> the application's own input range
    -> backbone (include_top=False) -> global average pooling -> [StatelessDropout] -> Dense(num_classes) logits

No download at run time: the constructor always gets weights=None, and `weights_path` (a `.weights.h5` written by
`backbone.save_weights`, or a legacy `.h5` such as Keras' published `*_no_top*.h5` files; local or gs://) is loaded
into the backbone; a file whose layers do not fit is a ConfigError naming the file and the model, before training.

Input range, so pretrained weights see what they were trained on: the task standardises pixels
(tasks/image_classification.py: x = (raw / max_pixel_value - mean) / std). `pixel_mean` / `pixel_std` must be that
task's mean and std (data/registry.py; the experiment config sets them, a test checks the shipped one): the model
undoes them, (x * std + mean) * 255 = RGB in [0, 255] (one grey channel is repeated to three), then maps to the range
the application's ImageNet weights expect: MobileNetV3* [0, 255] (their own include_preprocessing rescales),
MobileNetV2 / ResNet50V2 [-1, 1], ResNet50/101/152 caffe-style (BGR, minus the ImageNet channel means, unscaled).
All of it is inside the model, so serving (uint8 images -> the task's preprocess -> model) needs nothing more.

Hyperparameters every builder takes: dropout_rate and kernel_l2 apply to the head only (the backbone's own layers
are as Keras builds them: no L2, and none of these applications has dropout below its top); synchronized_batch_norm
sets every BatchNormalization of the backbone to synchronized (read at call time, so it holds after loading), and
batch_norm_momentum (None: Keras' own) sets their momentum the same way. Static shapes throughout (a fixed-size
Resizing), so it compiles for TPUs.
"""

import logging
import os
import tempfile
import warnings

import gin
import keras
import numpy as np
import tensorflow as tf

from common.errors import ConfigError, shorten
from models.layers import StatelessDropout, logits_dtype

log = logging.getLogger(__name__)

_IMAGENET_RGB_MEAN = (123.68, 116.779, 103.939)  # keras.applications.imagenet_utils, caffe mode (in RGB order).

# Supported names -> (the input range its pretrained weights expect, extra constructor arguments). The constructor
# is keras.applications.<name>. Only applications with no Keras Dropout below the top (EfficientNet's stochastic
# depth would make runs depend on the replica count), and whose include_top=False output is a feature map.
APPLICATIONS = {
    "MobileNetV3Small": ("0..255", {"include_preprocessing": True}),
    "MobileNetV3Large": ("0..255", {"include_preprocessing": True}),
    "MobileNetV2": ("-1..1", {}),
    "ResNet50": ("caffe", {}),
    "ResNet101": ("caffe", {}),
    "ResNet152": ("caffe", {}),
    "ResNet50V2": ("-1..1", {}),
}
WEIGHTS_SUFFIXES = (".weights.h5", ".h5")


@gin.configurable
def keras_application(input_shape, num_classes, *, name="MobileNetV3Small", input_size=(224, 224),
                      weights_path=None, pixel_mean=(0.0,), pixel_std=(1.0,), batch_norm_momentum=None,
                      dropout_rate=0.0, synchronized_batch_norm=False, kernel_l2=0.0) -> keras.Model:
    """keras.applications.<name> at `input_size`, weights from `weights_path` (None: random), a new logits head.

    batch_norm_momentum: of the backbone's moving statistics (used at eval); None keeps Keras' (0.999 in MobileNetV3,
    0.99 elsewhere: right for fine-tuning pretrained statistics, far too slow for a run of ~1,000 steps from random
    weights, whose eval would then use nearly the initial statistics; 0.9 there, as the cnn model).
    """
    if name not in APPLICATIONS:
        raise ConfigError(f"keras_application.name={name!r} is not supported; use one of {', '.join(APPLICATIONS)} "
                          "(models/keras_applications.py APPLICATIONS).")
    input_range, options = APPLICATIONS[name]
    height, width = (int(size) for size in input_size)
    channels = input_shape[-1] if len(input_shape) == 3 else None
    if channels not in (1, 3):
        raise ConfigError(f"MODEL='keras_application' takes images of 1 or 3 channels; this task's inputs have shape "
                          f"{tuple(input_shape)}. Use it with an image dataset.")
    backbone = getattr(keras.applications, name)(input_shape=(height, width, 3), include_top=False, weights=None,
                                                 **options)
    if weights_path:
        load_backbone_weights(backbone, weights_path, name)
    for layer in backbone.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.synchronized = synchronized_batch_norm  # BatchNormalization reads both in each call.
            if batch_norm_momentum is not None:
                layer.momentum = float(batch_norm_momentum)
    inputs = keras.Input(shape=input_shape, name="image")
    scale, offset = _input_transform(pixel_mean, pixel_std, input_range)
    # In float32 (float64 in the invariance check) even under mixed precision: bfloat16 would round pixels near 255.
    x = ApplicationInput(scale, offset, reverse_channels=input_range == "caffe", dtype=logits_dtype(),
                         name="application_input")(inputs)
    if (height, width) != tuple(input_shape[:2]):
        x = keras.layers.Resizing(height, width, interpolation="bilinear", name="resize")(x)
    x = backbone(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    if dropout_rate:
        x = StatelessDropout(dropout_rate, salt=0)(x)
    regularizer = keras.regularizers.L2(kernel_l2) if kernel_l2 else None
    logits = keras.layers.Dense(num_classes, kernel_regularizer=regularizer, dtype=logits_dtype(), name="logits")(x)
    return keras.Model(inputs, logits, name=f"keras_application_{name}")


def _input_transform(pixel_mean, pixel_std, input_range) -> tuple[list[float], list[float]]:
    """Per-channel (scale, offset), in RGB order, from the task's standardised pixels to the application's range."""
    mean, std = (np.broadcast_to(np.asarray(values, np.float64), (3,)) for values in (pixel_mean, pixel_std))
    rgb_scale, rgb_offset = std * 255.0, mean * 255.0  # -> [0, 255]
    if input_range == "-1..1":
        rgb_scale, rgb_offset = rgb_scale / 127.5, rgb_offset / 127.5 - 1.0
    elif input_range == "caffe":
        rgb_offset = rgb_offset - np.asarray(_IMAGENET_RGB_MEAN)
    return rgb_scale.tolist(), rgb_offset.tolist()


class ApplicationInput(keras.layers.Layer):
    """x * scale + offset per channel (a grey image repeated to 3 channels first), then RGB -> BGR if asked."""

    def __init__(self, scale, offset, *, reverse_channels=False, **kwargs):
        super().__init__(**kwargs)
        self.scale, self.offset, self.reverse_channels = list(scale), list(offset), bool(reverse_channels)

    def call(self, inputs):
        if inputs.shape[-1] == 1:
            inputs = tf.tile(inputs, [1, 1, 1, 3])
        x = inputs * tf.constant(self.scale, inputs.dtype) + tf.constant(self.offset, inputs.dtype)
        return x[..., ::-1] if self.reverse_channels else x

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], 3)

    def get_config(self):
        return {**super().get_config(), "scale": self.scale, "offset": self.offset,
                "reverse_channels": self.reverse_channels}


def load_backbone_weights(backbone: keras.Model, path: str, name: str) -> None:
    """Loads `path` (local or gs://) into `backbone`; a missing file or one that does not fit is a ConfigError."""
    setting = f"keras_application.weights_path={path!r}"
    if not path.endswith(WEIGHTS_SUFFIXES):
        raise ConfigError(f"{setting}: expected a Keras weights file ending in .weights.h5 (backbone.save_weights) "
                          "or a legacy .h5 (e.g. Keras' *_no_top*.h5 files).")
    if not tf.io.gfile.exists(path):
        raise ConfigError(f"{setting}: no such file. Give the path of a weights file of the {name} backbone "
                          "(include_top=False), local or gs://.")
    with tempfile.TemporaryDirectory() as folder:
        local = path
        if "://" in path:  # Keras reads local files; copy a gs:// one first.
            local = os.path.join(folder, "backbone" + next(s for s in WEIGHTS_SUFFIXES if path.endswith(s)))
            tf.io.gfile.copy(path, local)
        try:
            with warnings.catch_warnings():  # Keras warns per unmatched layer before raising; the error says it.
                warnings.simplefilter("ignore")
                backbone.load_weights(local)
        except (ValueError, OSError, KeyError) as error:
            raise ConfigError(f"{setting} does not fit the {name} backbone (include_top=False, input "
                              f"{backbone.input_shape[1:3]}): {shorten(str(error), 300)} Give a weights file of "
                              f"this application without its top, or change keras_application.name.") from error
    # Keras loads every variable of the backbone or raises (above): say what came from where, as INIT_FROM's table.
    values = sum(int(np.prod(variable.shape)) for variable in backbone.weights)
    log.info("keras_application.weights_path: loaded the %d variables (%s values) of the %s backbone from %s.",
             len(backbone.weights), f"{values:,}", name, path)
