"""ResNets (He et al. 2016, "Deep Residual Learning for Image Recognition"), the original (v1) layout.

- depth = 6n + 2 (20, 32, 44, 56, 110): the CIFAR variant of the paper's section 4.2, basic blocks, 16/32/64 filters,
  a 3x3 stem, for 32x32 images.
- depth = 50, 101, 152: the ImageNet variant, bottleneck blocks, a 7x7 stride-2 stem and max pooling.
Convolutions have no bias (BatchNormalization follows); the last BN of each residual branch starts at zero gamma
(Goyal et al. 2017), which makes large-batch training start as an identity network. Logits are float32.
"""

import gin
import keras

from common.errors import ConfigError
from models.layers import StatelessDropout, logits_dtype

_BOTTLENECK_STAGES = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


@gin.configurable
def resnet(input_shape, num_classes, *, depth=20, dropout_rate=0.0, synchronized_batch_norm=False,
           batch_norm_momentum=0.9, kernel_l2=0.0) -> keras.Model:
    """A ResNet of `depth` layers (see the module docstring for the allowed depths)."""
    if depth not in _BOTTLENECK_STAGES and (depth - 2) % 6:
        raise ConfigError(f"resnet.depth={depth}: use 6n + 2 (20, 32, 44, 56, 110) for 32x32 images or one of "
                         f"{sorted(_BOTTLENECK_STAGES)} for ImageNet-sized images.")
    layers = _Layers(synchronized_batch_norm, batch_norm_momentum, kernel_l2)
    inputs = keras.Input(shape=input_shape, name="image")
    if depth in _BOTTLENECK_STAGES:
        x = layers.conv_bn_relu(inputs, 64, 7, strides=2)
        x = keras.layers.MaxPooling2D(3, strides=2, padding="same")(x)
        for stage, blocks in enumerate(_BOTTLENECK_STAGES[depth]):
            for block in range(blocks):
                x = layers.bottleneck(x, 64 * 2 ** stage, strides=2 if stage and not block else 1)
    else:
        x = layers.conv_bn_relu(inputs, 16, 3)
        for stage in range(3):
            for block in range((depth - 2) // 6):
                x = layers.basic(x, 16 * 2 ** stage, strides=2 if stage and not block else 1)
    x = keras.layers.GlobalAveragePooling2D()(x)
    if dropout_rate:
        x = StatelessDropout(dropout_rate, salt=0)(x)
    logits = keras.layers.Dense(num_classes, kernel_regularizer=layers.regularizer, dtype=logits_dtype(),
                                name="logits")(x)
    return keras.Model(inputs, logits, name=f"resnet{depth}")


class _Layers:
    """Builds convolutions and blocks with the model's BatchNormalization and weight-decay settings."""

    def __init__(self, synchronized, momentum, kernel_l2):
        self.synchronized, self.momentum = synchronized, momentum
        self.regularizer = keras.regularizers.L2(kernel_l2) if kernel_l2 else None

    def conv_bn(self, x, filters, kernel_size, *, strides=1, zero_gamma=False):
        x = keras.layers.Conv2D(filters, kernel_size, strides=strides, padding="same", use_bias=False,
                                kernel_initializer="he_normal", kernel_regularizer=self.regularizer)(x)
        return keras.layers.BatchNormalization(momentum=self.momentum, synchronized=self.synchronized,
                                               gamma_initializer="zeros" if zero_gamma else "ones")(x)

    def conv_bn_relu(self, x, filters, kernel_size, *, strides=1):
        return keras.layers.ReLU()(self.conv_bn(x, filters, kernel_size, strides=strides))

    def shortcut(self, x, filters, strides):
        if strides == 1 and x.shape[-1] == filters:
            return x
        return self.conv_bn(x, filters, 1, strides=strides)  # Projection shortcut (option B of the paper).

    def basic(self, x, filters, *, strides):
        branch = self.conv_bn_relu(x, filters, 3, strides=strides)
        branch = self.conv_bn(branch, filters, 3, zero_gamma=True)
        return keras.layers.ReLU()(keras.layers.Add()([self.shortcut(x, filters, strides), branch]))

    def bottleneck(self, x, filters, *, strides):
        branch = self.conv_bn_relu(x, filters, 1)
        branch = self.conv_bn_relu(branch, filters, 3, strides=strides)
        branch = self.conv_bn(branch, 4 * filters, 1, zero_gamma=True)
        return keras.layers.ReLU()(keras.layers.Add()([self.shortcut(x, 4 * filters, strides), branch]))
