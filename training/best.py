"""The best checkpoint and export by BEST_METRIC (e.g. 'eval/accuracy'), kept apart from the rotating checkpoints.

When an evaluation is the best so far (training/history.py decides), its weights are saved to model_dir/best/
(one checkpoint, read back like every other: training/checkpoints.py) and exported to model_dir/export/best/, and
model_dir/best/best.json names its step, metric and value. Why apart: the rotating checkpoints keep the last 3, so
the best one would rotate away in a long run whose metric peaks early. Off unless BEST_METRIC is set. Every worker
saves (saving takes part in collectives); only the chief's files are kept.
"""

import json
import logging

import tensorflow as tf

from tpu_utils.strategy import io_device_for
from training.checkpoints import CheckpointStore
from training.export import export_saved_model

log = logging.getLogger(__name__)


class BestKeeper:
    """Saves and exports the model of the best evaluation so far."""

    def __init__(self, trainer, run_dir):
        self.trainer = trainer
        self.run_dir = run_dir
        write_dir = run_dir.best_dir
        self.store = CheckpointStore(trainer.checkpoint, read_dir=write_dir, write_dir=write_dir, keep=1,
                                     options=tf.train.CheckpointOptions(
                                         experimental_io_device=io_device_for(trainer.strategy, write_dir)),
                                     verify_saves=run_dir.is_chief)
        self._found = False

    def keep(self, best: dict) -> None:
        """Checkpoints and exports the current weights as the best (`best`: {'step', 'metric', 'mode', 'value'})."""
        if not self._found:  # Learns of a previous best (a resumed run), so that one rotates away.
            self.store.find_restorable(writable=self.run_dir.is_chief)
            self._found = True
        path = self.store.save(best["step"])
        export = self.run_dir.export_dir("best")
        export_saved_model(self.trainer.model, self.trainer.task, export,
                           io_device=io_device_for(self.trainer.strategy, export))
        if self.run_dir.is_chief:
            with tf.io.gfile.GFile(tf.io.gfile.join(self.run_dir.best_dir, "best.json"), "w") as handle:
                handle.write(json.dumps({**best, "checkpoint": path, "export": export}, indent=2, sort_keys=True))
            log.info("Best %s so far (%.4f at step %d): kept %s and exported %s.", best["metric"], best["value"],
                     best["step"], path, export)
