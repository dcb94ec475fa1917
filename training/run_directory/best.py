"""The best checkpoint and export by BEST_METRIC (e.g. 'eval/accuracy'), kept apart from the rotating checkpoints.

When an evaluation is the best so far (training/run_directory/history.py decides), its weights are saved to
model_dir/best/ (one checkpoint, read back like every other: training/run_directory/checkpoints.py) and exported to
model_dir/export/best/, and model_dir/best/best.json names its step, metric and value. Why apart: the rotating
checkpoints keep the last 3, so the best one would rotate away in a long run whose metric peaks early. Off unless
BEST_METRIC is set. Every worker saves (saving takes part in collectives); only the chief's files are kept.
"""

import logging

import tensorflow as tf

from tpu_utils.strategy import io_device_for
from training.run_directory.checkpoints import CheckpointStore
from training.run_directory.export import export_trainer
from training.run_directory.layout import BEST_RECORD

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

    def resume(self, *, writable: bool) -> None:
        """Learns of a previous best (a resumed run), so that it rotates away when a better one comes. Called before
        training: damaged files in best/ are an error now (exit 2), not in the middle of the run."""
        self.store.find_restorable(writable=writable)

    def keep(self, best: dict) -> None:
        """Checkpoints and exports the current weights as the best (`best`: {'step', 'metric', 'mode', 'value'})."""
        guard = self.run_dir.guard  # Waits out a failing storage, for experiment.storage_timeout_seconds.
        path = guard.retry(f"the save of the best checkpoint (step {best['step']})",
                           lambda: self.store.save(best["step"], before_commit=lambda: guard.check(confirm=True)))
        export = self.run_dir.export_dir("best")
        guard.retry(f"the export to {export}", lambda: export_trainer(
            self.trainer, export, recovery=f"its checkpoint {path} is intact: fix the storage and rerun the same "
            "command (training resumes from the last checkpoint).", before_commit=lambda: guard.check(confirm=True)))
        if self.run_dir.is_chief:
            self.run_dir.write_json(BEST_RECORD, {**best, "checkpoint": path, "export": export})
            log.info("Best %s so far (%.4f at step %d): kept %s and exported %s.", best["metric"], best["value"],
                     best["step"], path, export)
