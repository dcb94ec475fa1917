"""SavedModel export with a `serving_default` signature that takes the raw features, as the dataset stores them.

The signature is the task's (tasks/): it applies the same preprocessing as training, so a client sends what it has
(uint8 pixels, float feature vectors, ...) and gets named outputs (for classifiers: logits, probabilities, the
class id and its name). Reload with `tf.saved_model.load(path)` and call
`.signatures['serving_default'](**inputs)`; `keras.models.load_model` does not read SavedModel folders.

The SavedModel is written to a temporary sibling folder and renamed into place, so `export/<step>/` either holds a
complete SavedModel or does not exist (a full disk or a kill mid-export leaves no half-written version for a
server to pick up). gs:// has no folder rename (TensorFlow copies object by object), so there the files are copied
with `saved_model.pb` last, and an old version loses its `saved_model.pb` first: TF Serving and
`tf.saved_model.load` see a folder without it as no SavedModel, so a kill mid-copy leaves nothing loadable
half-written (the folder may hold stray variable files until the next export of that step replaces it). A kill
leaves the temporary folder behind: the next run removes it (training/leftovers.py).
"""

import re
import uuid

import keras
import tensorflow as tf

from common.errors import StorageError
from common.storage_errors import describe
from common.storage_paths import files_under, join, relative_to
from tasks.base import Task
from tpu_utils.strategy import io_device_for


class _ServingModule(tf.Module):
    def __init__(self, model: keras.Model, task: Task):
        super().__init__()
        self.model = model
        self._task = task

    def serve(self, **inputs):
        # A concrete function does not check the shapes it is called with: a wrong one would reach the model's ops
        # (a 3-D batch of images aborts the serving process in a convolution's shape check).
        specs = self._task.serving_signature()
        inputs = {key: tf.ensure_shape(value, specs[key].shape) for key, value in inputs.items()}
        return self._task.serve(self.model, inputs)


def export_saved_model(model: keras.Model, task: Task, export_dir: str, *, io_device: str | None = None) -> str:
    """Writes the SavedModel to `export_dir` (local or gs://) and returns it; `io_device` as in SaveOptions."""
    module = _ServingModule(model, task)
    signature = tf.function(module.serve, input_signature=None).get_concrete_function(**task.serving_signature())
    parent, name = export_dir.rstrip("/").rsplit("/", 1)
    temporary = join(parent, temporary_name(name))
    try:
        tf.saved_model.save(module, temporary, signatures={"serving_default": signature},
                            options=tf.saved_model.SaveOptions(experimental_io_device=io_device))
        if tf.io.gfile.exists(export_dir):  # A rerun exports the same step again; export/best every new best.
            if tf.io.gfile.exists(join(export_dir, MARKER)):
                tf.io.gfile.remove(join(export_dir, MARKER))  # No longer a SavedModel from here on.
            tf.io.gfile.rmtree(export_dir)
        _move(temporary, export_dir)
    finally:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.rmtree(temporary)
    return export_dir


MARKER = "saved_model.pb"  # What makes a folder a SavedModel for its readers.
TEMPORARY = re.compile(r"^\.(.+)\.tmp-[0-9a-f]{8}$")  # Names of temporary_name(); training/leftovers.py uses it.


def temporary_name(name: str) -> str:
    """The name of the folder the export `name` ('20', 'best') is written to before it moves into place."""
    return f".{name}.tmp-{uuid.uuid4().hex[:8]}"


def _move(source: str, target: str) -> None:
    """Renames folder `source` to `target`; on gs:// copies its files with MARKER last (see the module docstring).
    The files come from a listing, whose sub-folders end in '/' on gs://: their paths are built by
    common/storage_paths.py, never by joining with '/' (that read 'variables//variables.data-...', no such object)."""
    if not target.startswith("gs://"):
        tf.io.gfile.rename(source, target)
        return
    files = {relative_to(path, source): path for path in files_under(source)}  # Name below source -> exact path.
    for name in sorted(files, key=lambda name: name == MARKER):  # False first: MARKER last.
        destination = join(target, name)
        tf.io.gfile.makedirs(destination.rsplit("/", 1)[0])
        tf.io.gfile.copy(files[name], destination, overwrite=True)


def export_trainer(trainer, export_dir: str, *, recovery: str) -> str:
    """Exports `trainer`'s model with its task's signature to `export_dir`, on the device I/O its strategy needs; a
    storage failure is a StorageError naming the path, the cause and `recovery` (what is intact, what to rerun)."""
    try:
        return export_saved_model(trainer.model, trainer.task, export_dir,
                                  io_device=io_device_for(trainer.strategy, export_dir))
    except tf.errors.OpError as error:
        raise StorageError(f"Exporting the SavedModel to {export_dir} failed ({describe(error)}); {recovery}") \
            from error
