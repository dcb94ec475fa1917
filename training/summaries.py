"""TensorBoard events of a run (chief only; local or gs://): what `tensorboard --logdir runs` shows.

  model_dir/train/   scalars per loop: loss, metrics, learning_rate, steps_per_second, examples_per_second;
                     text `config/operative_gin` (the gin configuration used); images `inputs` (image tasks, at
                     step 0: the first eval images as stored, labels in the description)
  model_dir/eval/    scalars per evaluation: loss, metrics
  model_dir/         the HParams plugin's experiment: the run's settings, and the eval metrics as its results

Why: a curve without the settings that made it cannot be compared; the HParams table lines runs up by setting.
Every write is best effort: if the storage fails, a warning, and training goes on (checkpoints and metrics.json are
what a run cannot lose).
"""

import logging

import tensorflow as tf

log = logging.getLogger(__name__)

MAX_IMAGES = 8


class Summaries:
    """The TensorBoard writers of one run directory. Only the chief writes: off the chief every method returns before
    a writer is made (no events file at all)."""

    def __init__(self, run_dir):
        self.run_dir = run_dir
        self._writers = {}

    def writer(self, name: str):
        """Writer for model_dir/<name> ('' = model_dir itself), made once (one events file per process; chief only)."""
        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(self.run_dir.path(name) if name else
                                                                self.run_dir.model_dir)
        return self._writers[name]

    def _write(self, name: str, step: int, what: str, write) -> None:
        if not self.run_dir.is_chief:
            return
        try:
            with self.writer(name).as_default(step=step):
                write()
        except tf.errors.OpError as error:
            log.warning("TensorBoard %s for %s/ at step %d not written (%s); training goes on.", what, name, step,
                        " ".join(error.message.split())[:200])

    def scalars(self, name: str, step: int, values: dict) -> None:
        def write():
            for tag, value in values.items():
                tf.summary.scalar(tag, value)
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
        for writer in self._writers.values():
            try:
                writer.flush()
            except tf.errors.OpError:
                pass


def _hparam_value(value):
    """HParams take bool, int, float or str: anything else (tuples, None) as its repr."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
