"""SavedModel export with a `serving_default` signature that takes raw images, as the dataset stores them.

The signature applies the dataset's own preprocessing (`DatasetSpec.preprocess`), so a client sends what it has
(uint8 pixels) and gets logits, probabilities and the predicted class. Reload with `tf.saved_model.load(path)` and
call `.signatures['serving_default'](images=...)`; `keras.models.load_model` does not read SavedModel folders.

The SavedModel is written to a temporary sibling folder and renamed into place, so `export/<step>/` either holds a
complete SavedModel or does not exist (a full disk or a kill mid-export leaves no half-written version for a
server to pick up).
"""

import uuid

import keras
import tensorflow as tf

from data.registry import DatasetSpec


class _ServingModule(tf.Module):
    def __init__(self, model: keras.Model, spec: DatasetSpec):
        super().__init__()
        self.model = model
        self._spec = spec

    def serve(self, images):
        logits = tf.cast(self.model(self._spec.preprocess(images), training=False), tf.float32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits),
                "classes": tf.argmax(logits, axis=-1, output_type=tf.int32)}


def export_saved_model(model: keras.Model, spec: DatasetSpec, export_dir: str, *, io_device: str | None = None) -> str:
    """Writes the SavedModel to `export_dir` (local or gs://) and returns it; `io_device` as in SaveOptions."""
    module = _ServingModule(model, spec)
    signature = tf.function(module.serve, input_signature=[
        tf.TensorSpec([None, *spec.image_shape], tf.uint8, name="images")])
    parent, name = export_dir.rstrip("/").rsplit("/", 1)
    temporary = f"{parent}/.{name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tf.saved_model.save(module, temporary, signatures={"serving_default": signature},
                            options=tf.saved_model.SaveOptions(experimental_io_device=io_device))
        if tf.io.gfile.exists(export_dir):  # A rerun exports the same step again.
            tf.io.gfile.rmtree(export_dir)
        tf.io.gfile.rename(temporary, export_dir)
    finally:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.rmtree(temporary)
    return export_dir
