"""Models by name (`MODEL`). A model builder is a function

    builder(input_shape, num_classes, *, dropout_rate, synchronized_batch_norm, kernel_l2) -> keras.Model

returning float32 logits (keep the last layer in float32 under mixed precision). Its other hyperparameters are
keyword arguments bound with gin (e.g. `mlp.hidden_units = (256, 256)`). The replica-invariance check calls it with
dropout_rate=0 and synchronized_batch_norm=True, so every builder must honour both.
"""

from collections.abc import Callable

import keras

from models import cnn, mlp, resnet
from training.errors import ConfigError

ModelBuilder = Callable[..., keras.Model]

MODELS: dict[str, ModelBuilder] = {
    "mlp": mlp.mlp,
    "cnn": cnn.cnn,
    "resnet": resnet.resnet,
}


def get_model_builder(name: str) -> ModelBuilder:
    """The registered builder for `name`; a ConfigError that lists the known names otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"Unknown MODEL={name!r}. Known models: {', '.join(sorted(MODELS))}. Register a new one "
                          "in models/registry.py.") from None
