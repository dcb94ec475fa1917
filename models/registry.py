"""Models by name (`MODEL`). A model builder is a function

    builder(input_shape, num_classes, *, dropout_rate, synchronized_batch_norm, kernel_l2) -> keras.Model

returning logits of dtype `models.layers.logits_dtype()` (float32 under float32 and mixed precision, float64 under
PRECISION='float64'). Its other hyperparameters are keyword arguments bound with gin (e.g.
`mlp.hidden_units = (256, 256)`). The replica-invariance check calls it with synchronized_batch_norm=True, so every
builder must honour it; use `models.layers.StatelessDropout` (not keras.layers.Dropout) so that runs with dropout
stay replica-count invariant and exactly resumable.
"""

from collections.abc import Callable

import keras

from common.registry import lookup
from models import cnn, keras_applications, mlp, resnet, transformer

ModelBuilder = Callable[..., keras.Model]

MODELS: dict[str, ModelBuilder] = {
    "mlp": mlp.mlp,
    "cnn": cnn.cnn,
    "resnet": resnet.resnet,
    "transformer": transformer.transformer,  # Token ids -> class (the text example).
    "keras_application": keras_applications.keras_application,  # keras.applications.<name>, weights from a file.
}


def get_model_builder(name: str) -> ModelBuilder:
    """The registered builder for `name`; a ConfigError that lists the known names otherwise."""
    return lookup(MODELS, name, named=f"MODEL={name!r}", known="models", where="models/registry.py")
