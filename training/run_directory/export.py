"""SavedModel export with a `serving_default` signature that takes the raw features, as the dataset stores them.

The signature is the task's (tasks/): it applies the same preprocessing as training, so a client sends what it has
(uint8 pixels, float feature vectors, ...) and gets named outputs (for classifiers: logits, probabilities, the
class id and its name). Reload with `tf.saved_model.load(path)` and call
`.signatures['serving_default'](**inputs)`; `keras.models.load_model` does not read SavedModel folders.

Written through `keras.export.ExportArchive`, which saves the model's variables where the graph-mode loader of TF
Serving, Vertex AI and `saved_model_cli run` restores them from (a Keras 3 model held by a tf.Module and saved with
tf.saved_model.save loads in tf.saved_model.load, but that loader fails with "Could not find variable ..."). Beside
it, in assets.extra/ (serving/): serving_metadata.json, TF Serving's tf_serving_warmup_requests and a Vertex AI
example_request.json (both from the first eval examples), and on request model.tflite (docs/serving.md).

The SavedModel is written to a temporary sibling folder and renamed into place, so `export/<step>/` either holds a
complete SavedModel or does not exist (a full disk or a kill mid-export leaves no half-written version for a
server to pick up). gs:// has no folder rename (TensorFlow copies object by object), so there the files are copied
with `saved_model.pb` last, and an old version loses its `saved_model.pb` first: TF Serving and
`tf.saved_model.load` see a folder without it as no SavedModel, so a kill mid-copy leaves nothing loadable
half-written (the folder may hold stray variable files until the next export of that step replaces it). A kill
leaves the temporary folder behind: the next run removes it (training/run_directory/leftovers.py).
"""

import json
import logging
import re
import uuid

import keras
import tensorflow as tf

from common.errors import StorageError
from common.storage_errors import describe
from common.storage_paths import files_under, join, relative_to
from serving import metadata, requests, tflite, warmup
from serving.examples import first_examples
from tasks.base import Task
from tpu_utils.strategy import io_device_for

log = logging.getLogger(__name__)

WARMUP_BATCH_SIZES = (1, 2, 4)  # One warmup request per size, of the first eval examples.
EXAMPLE_REQUEST_SIZE = 2  # Instances in assets.extra/example_request.json.


def _serving_function(model: keras.Model, task: Task):
    """The signature's body: the task's serving outputs for raw inputs, their shapes checked first."""
    specs = task.serving_signature()

    def serve(**inputs):
        # A concrete function does not check the shapes it is called with: a wrong one would reach the model's ops
        # (a 3-D batch of images aborts the serving process in a convolution's shape check).
        inputs = {key: tf.ensure_shape(value, specs[key].shape) for key, value in inputs.items()}
        return task.serve(model, inputs)

    return serve


def write_saved_model(model: keras.Model, task: Task, folder: str, *, io_device: str | None = None,
                      examples: dict | None = None, with_tflite: bool = False,
                      tflite_image_size: tuple[int, int] | None = None) -> None:
    """Writes the SavedModel and its assets.extra/ files (the module docstring) into the new `folder`. `examples`
    ({input name: array [n, ...]}, raw eval examples) make the warmup and example requests; None: neither.
    `with_tflite`: also model.tflite (serving/tflite.py), at `tflite_image_size` for an any-size image export."""
    serve, signature = _serving_function(model, task), task.serving_signature()
    function = tf.function(serve)
    outputs = function.get_concrete_function(**signature).structured_outputs
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(metadata.SIGNATURE, function)
    archive.write_out(folder, options=tf.saved_model.SaveOptions(experimental_io_device=io_device), verbose=False)
    extra = join(folder, metadata.FOLDER)
    tf.io.gfile.makedirs(extra)
    if examples is not None:
        warmup.write(join(extra, warmup.FILE_NAME),
                     [{name: values[:size] for name, values in examples.items()} for size in WARMUP_BATCH_SIZES])
        example_request = {name: values[:EXAMPLE_REQUEST_SIZE] for name, values in examples.items()}
        _write_text(join(extra, requests.FILE_NAME), requests.request_json(example_request))
    output_specs = {name: tf.TensorSpec.from_tensor(value) for name, value in outputs.items()}
    tflite_described = tflite.write(folder, serve, signature, output_specs, [var.value for var in model.variables],
                                    image_size=tflite_image_size, class_names=task.serving_metadata().get(
                                        "class_names")) if with_tflite else None
    described = metadata.describe(task.serving_metadata(), signature, output_specs, tflite=tflite_described)
    _write_text(join(extra, metadata.FILE_NAME), json.dumps(described, indent=2) + "\n")


def _write_text(path: str, text: str) -> None:
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(text)


def export_saved_model(model: keras.Model, task: Task, export_dir: str, *, io_device: str | None = None,
                       examples: dict | None = None, with_tflite: bool = False,
                       tflite_image_size: tuple[int, int] | None = None, before_commit=None) -> str:
    """Writes the SavedModel to `export_dir` (local or gs://) and returns it; `io_device` as in SaveOptions,
    `examples` and `with_tflite` as in write_saved_model. `before_commit()` runs once it is written, before it
    replaces anything, and may raise (a run that lost its lock meanwhile stops there)."""
    parent, name = export_dir.rstrip("/").rsplit("/", 1)
    temporary = join(parent, temporary_name(name))
    try:
        write_saved_model(model, task, temporary, io_device=io_device, examples=examples, with_tflite=with_tflite,
                          tflite_image_size=tflite_image_size)
        if before_commit is not None:
            before_commit()
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
TEMPORARY = re.compile(r"^\.(.+)\.tmp-[0-9a-f]{8}$")  # temporary_name()'s names; leftovers.py uses it.


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


def export_trainer(trainer, export_dir: str, *, recovery: str, before_commit=None) -> str:
    """Exports `trainer`'s model (its EMA weights when EMA_DECAY is set) with its task's signature to `export_dir`,
    on the device I/O its strategy needs; a storage failure is a StorageError naming the path, the cause and
    `recovery` (what is intact, what to rerun). `before_commit` as in export_saved_model."""
    try:
        examples = first_examples(trainer.task, trainer.builder, trainer.dataset_spec.eval_split,
                                  max(WARMUP_BATCH_SIZES))
        with trainer.serving_weights():  # EMA_DECAY: the EMA weights are the ones served (export/best/ too).
            return export_saved_model(trainer.model, trainer.task, export_dir,
                                      io_device=io_device_for(trainer.strategy, export_dir), examples=examples,
                                      with_tflite=trainer.config.export_tflite,
                                      tflite_image_size=trainer.config.export_tflite_image_size,
                                      before_commit=before_commit)
    except tf.errors.OpError as error:
        raise StorageError(f"Exporting the SavedModel to {export_dir} failed ({describe(error)}); {recovery}") \
            from error
