"""A small convolutional network with BatchNormalization: the default model for the digits experiment."""

import gin
import keras

from models.layers import StatelessDropout, logits_dtype


@gin.configurable
def cnn(input_shape, num_classes, *, filters=(32, 64), dense_units=128, dropout_rate=0.0,
        synchronized_batch_norm=False, batch_norm_momentum=0.9, kernel_l2=0.0) -> keras.Model:
    """[Conv3x3 + BN + ReLU + (MaxPool if the image is still > 4 px)] per entry of `filters` -> GAP -> Dense -> logits.

    synchronized_batch_norm: compute batch statistics over all replicas (exact replica invariance, at the cost of
    one all-reduce per BN layer); otherwise each replica normalises with its own batch's statistics.
    batch_norm_momentum: of the moving statistics used at eval; 0.9 (not Keras' 0.99) suits runs of ~1,000 steps.
    """
    regularizer = keras.regularizers.L2(kernel_l2) if kernel_l2 else None
    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    size = min(input_shape[0], input_shape[1])
    for count in filters:
        x = keras.layers.Conv2D(count, 3, padding="same", use_bias=False, kernel_regularizer=regularizer)(x)
        x = keras.layers.BatchNormalization(momentum=batch_norm_momentum,
                                                synchronized=synchronized_batch_norm)(x)
        x = keras.layers.ReLU()(x)
        if size > 4:
            x = keras.layers.MaxPooling2D(2)(x)
            size //= 2
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(dense_units, activation="relu", kernel_regularizer=regularizer)(x)
    if dropout_rate:
        x = StatelessDropout(dropout_rate, salt=0)(x)
    logits = keras.layers.Dense(num_classes, kernel_regularizer=regularizer, dtype=logits_dtype(), name="logits")(x)
    return keras.Model(inputs, logits, name="cnn")
