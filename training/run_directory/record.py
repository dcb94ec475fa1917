"""RunRecord: the one object that writes a run's directory; the host loop and its observers ask it.

It owns, for one Trainer in one role (--mode): the run's identity (written and checked here only), the rotating
checkpoints (save, read back, restore, fall back), the history (metrics.jsonl, metrics.json) and its ranking of
evaluations, the best checkpoint and export (best/, export/best/) and the exports. Files go through a RunDirectory
(layout.py: names, paths, lock, storage guard).

Roles: 'train' writes everything; 'eval' and 'export' restore and record their result; 'continuous_eval' (the
sidecar evaluator) reads the training job's checkpoints and writes its records in eval_sidecar/. best/ has one
writer per run directory: the training job when it evaluates during training (EVAL_EVERY > 0), else the sidecar.
"""

import logging
import time

import tensorflow as tf

from common.errors import ConfigError, StorageError
from tpu_utils.strategy import io_device_for, is_multi_worker
from training.run_directory import identity as run_identity
from training.run_directory.best import BestKeeper
from training.run_directory.checkpoints import CheckpointStore, checkpoint_steps, named_steps, verify
from training.run_directory.export import export_trainer
from training.run_directory.history import History, ranked_by, read_records
from training.run_directory.layout import COMMAND, IDENTITY, OPERATIVE_CONFIG, SIDECAR, SUMMARY, RunDirectory
from training.run_directory.leftovers import remove_leftovers

log = logging.getLogger(__name__)

ROLES = ("train", "eval", "export", "continuous_eval")
# How long restore_step waits at most for a rotation seen half done to finish: one delete per file (on gs:// a request).
ROTATION_SECONDS = 10.0


def keeps_best(config, role: str) -> bool:
    """Whether a process in `role` keeps best/: BEST_METRIC set, and the training job evaluates during training
    (EVAL_EVERY > 0) or else the sidecar does."""
    if not config.best_metric:
        return False
    return bool(config.eval_every) if role == "train" else role == "continuous_eval" and not config.eval_every


def _drop_partial_restore_warnings(record) -> bool:
    """A logging filter: False for TensorFlow's warnings about a checkpoint whose restore was abandoned."""
    message = record.getMessage()
    return not ("deleted with unrestored values" in message or "could not be found in the restored object" in message)


class RunRecord:
    """What `trainer` has written and writes in `directory` as `role`. `model_settings`: the model builder's
    arguments as gin bound them ({'cnn.filters': (32, 64)}), part of the identity."""

    def __init__(self, trainer, directory: RunDirectory, *, role: str = "train", model_settings: dict | None = None):
        config = trainer.config
        self.trainer, self.directory, self.role, self.config = trainer, directory, role, config
        self.model_settings = model_settings or {}
        self.identity = run_identity.run_identity(config, self.model_settings,
                                                  data=run_identity.data_identity(trainer.builder))
        # Non-chief workers save to a temporary folder (they must save too) and resume from the chief's checkpoints.
        self.checkpoints = CheckpointStore(
            trainer.checkpoint, read_dir=directory.checkpoint_dir, write_dir=directory.checkpoint_write_dir,
            keep=config.checkpoints_to_keep, verify_saves=directory.is_chief,
            options=tf.train.CheckpointOptions(experimental_io_device=io_device_for(
                trainer.strategy, directory.checkpoint_write_dir)))
        # A multi-worker save is collective, so one worker cannot retry it alone.
        directory.guard.recovery = self.checkpoints.previous_phrase
        directory.guard.retries = not is_multi_worker(trainer.strategy)
        # Where this role's records go: the sidecar's in eval_sidecar/, beside the training job's.
        self.records = directory.folder(SIDECAR) if role == "continuous_eval" else directory
        self.eval_events = "" if role == "continuous_eval" else "eval"  # TensorBoard folder below `records`.
        metric, mode = ranked_by(config)
        self.history = History(self.records, metric=metric, mode=mode, evaluated=trainer.evaluated_names)
        self.best = BestKeeper(trainer, directory) if keeps_best(config, role) else None
        self.saved_step = None  # Step of the newest checkpoint this process wrote or restored.

    @property
    def is_chief(self) -> bool:
        return self.directory.is_chief

    def may_write(self) -> bool:
        """Whether this run may still write model_dir (its lock held, its storage not failing for too long)."""
        try:
            self.directory.guard.check()
        except StorageError:
            return False
        return True

    # --- identity

    def write_start(self, *, command: str, operative_config: str) -> None:
        """At the start of training: run_identity.json (when it changed), command.txt, operative_config.gin."""
        if self.directory.read_json(IDENTITY) != self.identity:
            self.directory.write_json(IDENTITY, self.identity)
        self.directory.write_text(COMMAND, command + "\n")
        self.directory.write_text(OPERATIVE_CONFIG, operative_config)

    def check_identity(self) -> None:
        """A ConfigError (exit 2) if the checkpoints here are of another configuration, as a resume checks; for the
        sidecar also if its evaluation settings differ from the training job's (one writer of best/)."""
        previous = self.directory.read_json(IDENTITY)
        run_identity.check_resume(previous, self.identity, model_dir=self.directory.model_dir,
                                  data_dir=self.config.data_dir)
        if self.role == "continuous_eval":
            run_identity.check_sidecar(previous, self.identity, model_dir=self.directory.model_dir)

    # --- checkpoints

    def restore(self, *, writable: bool = True) -> int:
        """Restores the newest intact checkpoint if there is one (after checking it belongs to this run), else warm
        starts from INIT_FROM if set (training/warm_start.py); returns the step. Damaged newer checkpoints are
        skipped with a warning; none intact among files is exit 2. The chief of a run that may write model_dir first
        removes what a killed run left there (leftovers.py)."""
        trainer, directory = self.trainer, self.directory
        if writable and directory.is_chief:
            remove_leftovers(directory.model_dir)
        latest = self.checkpoints.find_restorable(writable=writable and directory.is_chief)
        previous = directory.read_json(IDENTITY)
        directory.read_json(SUMMARY)  # A corrupt one is exit 2 now, not after training.
        if latest:
            self.check_identity()
            try:
                trainer.restore(latest)
            except (ValueError, AssertionError, tf.errors.OpError) as error:  # Shapes or dtypes do not fit.
                # The half-done restore would warn about "unrestored values" when it is garbage-collected, after
                # (and burying) the one line that says what to do.
                tf.get_logger().addFilter(_drop_partial_restore_warnings)
                raise run_identity.restore_mismatch_error(previous, self.identity, checkpoint=latest, error=error,
                                                          model_dir=directory.model_dir) from error
            self.saved_step = trainer.step
            log.info("Resumed from %s at step %d.", latest, trainer.step)
            if self.config.init_from:
                log.info("INIT_FROM=%r not used: this run resumes from its own checkpoint.", self.config.init_from)
        elif self.config.init_from:  # A new run: model variables from INIT_FROM; optimizer and step stay new.
            trainer.warm_start()
        if self.best is not None:
            self.best.resume(writable=writable and directory.is_chief)
        self.history.resume(trainer.step, rewrite=writable)
        return trainer.step

    def restore_for_inference(self, *, writable: bool = True) -> int:
        """Restores the newest intact checkpoint for --mode=eval/export; a ConfigError if there is none."""
        if not self.checkpoints.has_files():
            raise ConfigError(f"No checkpoint in {self.directory.checkpoint_dir}: train first (--mode=train) or pass "
                              "the --model_dir of a trained run.")
        return self.restore(writable=writable)

    def save(self, step: int) -> None:
        """Checkpoints `step` (once). The run lock is read back first; a failing storage is retried (training
        waits) for experiment.storage_timeout_seconds."""
        if step == self.saved_step:
            return
        guard = self.directory.guard

        def attempt():  # The lock is read back before the save, and again before it counts (the state file).
            guard.check(confirm=True)
            return self.checkpoints.save(step, before_commit=lambda: guard.check(confirm=True))

        guard.retry(f"the checkpoint save of step {step}", attempt)
        self.saved_step = step

    # --- evaluations

    def write_summary(self, step: int, train: dict, evaluation: dict) -> dict:
        """metrics.json of this role's records: the evaluation of `step`, the last training loop's figures (`train`;
        empty: those already recorded) and the best evaluation so far; returns {'step', 'train', 'eval'}."""
        if not train:  # --mode=eval, the sidecar, or nothing left to train: keep the recorded training figures.
            train = (self.records.read_json(SUMMARY) or {}).get("train", {})
        self.records.write_metrics(step, train, evaluation, best=self.history.best)
        return {"step": step, "train": train, "eval": evaluation}

    def export(self) -> str:
        """Exports the trainer's model as export/<step>/ (every worker exports; only the chief's is kept)."""
        path = self.directory.export_dir(self.trainer.step)
        latest, guard = self.checkpoints.latest or "(none)", self.directory.guard
        guard.retry(f"the export to {path}", lambda: export_trainer(
            self.trainer, path, recovery=f"nothing was left there. The checkpoint {latest} is intact: fix the "
            "storage, then rerun with --mode=export.", before_commit=lambda: guard.check(confirm=True)))
        if self.is_chief:
            log.info("Exported SavedModel to %s", path)
        return path

    # --- the sidecar's view of the training job's checkpoints

    def resume_records(self) -> set[int]:
        """The sidecar's start: its ledger reloaded (a half-written last line dropped), its previous best learnt;
        returns the steps the ledger holds (evaluated or skipped)."""
        self.history.resume(2**62)
        if self.best is not None:
            self.best.resume(writable=True)
        elif self.config.best_metric:
            log.info("BEST_METRIC=%r with EVAL_EVERY=%d: best/ is kept by the training job; this sidecar records its "
                     "evaluations only.", self.config.best_metric, self.config.eval_every)
        return {record["step"] for record in self.ledger()}

    def ledger(self) -> list[dict]:
        """The sidecar's records of checkpoints: 'eval' (evaluated) or 'skipped' (and why)."""
        return [record for record in read_records(self.history.path) if record["kind"] in ("eval", "skipped")]

    def has_identity(self) -> bool:
        return self.directory.read_json(IDENTITY) is not None

    def ready_steps(self, after: int) -> list[int]:
        """Steps after `after` whose checkpoints the training job has read back (named in its state file)."""
        return [step for step in named_steps(self.directory.checkpoint_dir) if step > after]

    def skip(self, step: int, why: str) -> None:
        log.warning("Checkpoint of step %d not evaluated: %s (recorded as skipped in %s).", step, why,
                    self.history.path)
        self.history.record("skipped", step, {}, reason=why)

    def restore_step(self, step: int) -> str | None:
        """Restores the checkpoint of `step` into the trainer; None, or why it cannot be (rotated away or damaged).
        A storage that does not answer is a StorageError (exit 6), never a reason to skip."""
        checkpoint_dir = self.directory.checkpoint_dir
        path = self.checkpoints.path(step)
        reason = verify(path)
        if reason is None:
            try:
                self.trainer.restore(path)
            except (tf.errors.OpError, ValueError) as error:  # Rotated away between the read-back and the restore?
                # TensorFlow's rotation deletes a checkpoint's files one at a time, the state file after them: it
                # may be half done (a restore failed so in CI). Judged once it has had time to finish.
                deadline = time.monotonic() + ROTATION_SECONDS
                while step in checkpoint_steps(checkpoint_dir):
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.2)
                reason = f"unreadable ({type(error).__name__})"
        if reason is None:
            return None
        return "rotated away while the sidecar read it" if step not in checkpoint_steps(checkpoint_dir) else \
            f"damaged: {reason}"
