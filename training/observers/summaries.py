"""TensorBoard events of a run (chief only; local or gs://): what `tensorboard --logdir runs` shows.

  model_dir/train/   scalars per loop: loss, metrics, learning_rate, steps_per_second, examples_per_second;
                     text `config/operative_gin` (the gin configuration used); images `inputs` (image tasks, at
                     step 0: the first eval images as stored, labels in the description)
  model_dir/eval/    scalars per evaluation: loss, metrics
  model_dir/         the HParams plugin's experiment: the run's settings, and the eval metrics as its results

Why: a curve without the settings that made it cannot be compared; the HParams table lines runs up by setting.
Each write is flushed at once (tf.summary's `as_default` block does). When one fails (a full disk, an unreachable
bucket), that events file is given up: after a failed flush TensorFlow's writer can leave a partial record, past
which TensorBoard reads nothing of that file. What failed is kept and written again, with the next write, into a
new events file of the same folder (TensorBoard reads every file of a folder). Training goes on meanwhile, until
the storage has failed for `experiment.storage_timeout_seconds` (training/run_directory/storage_guard.py); events that
could still not be written at the end are named in a warning (their values are in metrics.jsonl).
"""

import logging

import numpy as np
import tensorflow as tf

from common.storage_errors import describe
from common.storage_paths import join
from common.storage_wait import reporting_on_gcs

log = logging.getLogger(__name__)

MAX_IMAGES = 8
# Writers given up (a failed write, or the run stopped by a storage failure) stay referenced here until the process
# exits: a dropped writer flushes its queue into its file when it is destroyed, which must not happen after the run
# knows it may not write (train.py ends such a run with os._exit, after its exit handlers, not garbage collection).
_GIVEN_UP = []


class Summaries:
    """The TensorBoard writers of one run directory. Only the chief writes: off the chief every method returns before
    a writer is made (no events file at all)."""

    def __init__(self, run_dir):
        self.run_dir = run_dir
        self._writers = {}
        self._unwritten = {}  # name -> [(step, what, write)]: failed writes, written again into a new file.

    def writer(self, name: str):
        """Writer for model_dir/<name> ('' = model_dir itself), made once (one events file per process; chief only)."""
        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(self.run_dir.path(name) if name else
                                                                self.run_dir.model_dir)
        return self._writers[name]

    def _write(self, name: str, step: int, what: str, write) -> None:
        if not self.run_dir.is_chief:
            return
        self.run_dir.guard.check()  # The run lock still held, the storage not failing for too long.
        self._unwritten.setdefault(name, []).append((step, what, write))
        self._write_unwritten(name)

    def _write_unwritten(self, name: str) -> None:
        """Writes the kept writes of `name` in order; after a failure, keeps them for a new events file."""
        guard, pending = self.run_dir.guard, self._unwritten[name]
        folder = self.run_dir.path(name) if name else self.run_dir.model_dir
        try:
            with reporting_on_gcs(f"the TensorBoard events in {folder}", folder):
                writer = self.writer(name)
                for step, _, write in pending:
                    with writer.as_default(step=step):  # Flushes on exit: each write reaches the storage now.
                        write()
        except tf.errors.OpError as error:
            _GIVEN_UP.append(self._writers.pop(name, None))  # The next write starts a new events file.
            step, what, _ = pending[-1]
            log.warning("TensorBoard %s for %s/ at step %d not written (%s); kept, and written into a new events "
                        "file with the next write.", what, name or ".", step, describe(error, 200))
            guard.failed(f"writing TensorBoard events to {folder}", error)
            return
        pending.clear()
        guard.succeeded()

    def scalars(self, name: str, step: int, values: dict) -> None:
        def write():
            for tag, value in values.items():
                # As a float64: TensorBoard stores float32, and a finite float64 loss past float32's range
                # (a diverging float64 run) is then written as inf instead of failing the conversion of a number.
                tf.summary.scalar(tag, np.float64(value))
        self._write(name, step, "events", write)

    def config_text(self, step: int, operative_config: str) -> None:
        """The operative gin config, as a code block (TensorBoard's Text tab renders markdown)."""
        text = "```\n" + operative_config + "\n```"
        self._write("train", step, "config text", lambda: tf.summary.text("config/operative_gin", text))

    def hparams(self, step: int, settings: dict, metric_names: list[str]) -> None:
        """The run's settings and its eval metrics (read from model_dir/eval) for the HParams plugin."""
        from tensorboard.plugins.hparams import api as hp

        values = {name: _hparam_value(value) for name, value in settings.items()}
        metrics = [hp.Metric(name, group="eval", display_name=f"eval/{name}") for name in metric_names]

        def write():
            hp.hparams_config(hparams=[hp.HParam(name) for name in values], metrics=metrics)
            hp.hparams(values, trial_id=self.run_dir.model_dir)
        self._write("", step, "hparams", write)

    def input_images(self, step: int, task, builder, split: str) -> None:
        """The first few images of `split` as stored (image tasks only), with their labels in the description."""
        shape = getattr(task, "image_shape", None)
        if not shape or len(shape) != 3 or not self.run_dir.is_chief:
            return
        images, labels = [], []
        import tensorflow_datasets as tfds

        # No auto-cache: a small split would be cached, and reading 8 of it warns that the cache is discarded.
        read_config = tfds.ReadConfig(try_autocache=False)
        for example in builder.as_dataset(split=split, shuffle_files=False, read_config=read_config).take(MAX_IMAGES):
            image = tf.image.resize_with_crop_or_pad(example[task.image_key], shape[0], shape[1])
            images.append(tf.cast(image, tf.float32) / task.max_pixel_value)
            label = int(example[task.label_key])
            names = task.class_names or ()
            labels.append(names[label] if label < len(names) else str(label))
        if not images:
            return
        batch = tf.clip_by_value(tf.stack(images), 0.0, 1.0)
        description = "Labels, left to right: " + ", ".join(labels)
        self._write("train", step, "images",
                    lambda: tf.summary.image("inputs", batch, max_outputs=MAX_IMAGES, description=description))

    def flush(self) -> None:
        """At the end of a run (also a failed one: it never raises): writes what failed before once more, flushes
        every writer, and names in a warning the events still missing. Once the run may not write (its lock lost,
        the storage failing too long), nothing at all: the writers are given up unflushed."""
        if self.run_dir.guard.writable:
            for name, pending in self._unwritten.items():
                if pending:
                    try:
                        self._write_unwritten(name)
                    except Exception:  # noqa: BLE001 - a StorageError now must not hide the run's own outcome.
                        break
        if not self.run_dir.guard.writable:
            _GIVEN_UP.extend(self._writers.values())
            self._writers.clear()
        for writer in self._writers.values():
            try:
                writer.flush()
            except tf.errors.OpError:
                pass
        missing = {name or ".": sorted({step for step, _, _ in pending}) for name, pending in self._unwritten.items()
                   if pending}
        if missing and self.run_dir.guard.writable:  # (A run stopped by its storage says so in its error.)
            log.warning("TensorBoard events not written (the storage failed): %s. Their values are in "
                        "metrics.jsonl.", "; ".join(f"{name}/ at steps {', '.join(map(str, steps))}"
                                                    for name, steps in missing.items()))


def event_steps(folder: str) -> set[int]:
    """Steps with summary values in the TensorBoard files of `folder` (a truncated last record ends that file's
    read)."""
    steps = set()
    for path in tf.io.gfile.glob(join(folder, "events.out.tfevents.*")):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                if event.summary.value:
                    steps.add(event.step)
        except tf.errors.DataLossError:
            pass
    return steps


def _hparam_value(value):
    """HParams take bool, int, float or str: anything else (tuples, None) as its repr."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
