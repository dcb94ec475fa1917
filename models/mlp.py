"""A multilayer perceptron: the smallest model that exercises every part of the training step."""

import gin
import keras

from models.layers import StatelessDropout, logits_dtype


@gin.configurable
def mlp(input_shape, num_classes, *, hidden_units=(256, 256), dropout_rate=0.0, synchronized_batch_norm=False,
        kernel_l2=0.0) -> keras.Model:
    """Flatten -> [Dense + ReLU + Dropout] * len(hidden_units) -> Dense logits (float32, or float64 in float64).

    synchronized_batch_norm is accepted for the builder interface; this model has no BatchNormalization.
    """
    del synchronized_batch_norm
    regularizer = keras.regularizers.L2(kernel_l2) if kernel_l2 else None
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Flatten()(inputs)
    for index, units in enumerate(hidden_units):
        x = keras.layers.Dense(units, activation="relu", kernel_regularizer=regularizer)(x)
        if dropout_rate:
            x = StatelessDropout(dropout_rate, salt=index)(x)
    logits = keras.layers.Dense(num_classes, kernel_regularizer=regularizer, dtype=logits_dtype(), name="logits")(x)
    return keras.Model(inputs, logits, name="mlp")
