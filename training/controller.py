"""The host loop: the only code that decides when to log, evaluate, checkpoint, summarise and export.

Between two on-device loops of STEPS_PER_LOOP steps it tells its observers (training/observers/: the finite guard,
the profiler, progress lines, TensorBoard, metrics.jsonl, best-keeping; yours through `experiment.observers`),
evaluates every EVAL_EVERY steps (rewriting metrics.json), checkpoints every CHECKPOINT_EVERY steps
(training/run_directory/checkpoints.py: read back before older ones are deleted), and honours SIGTERM/SIGINT
(checkpoint, then exit 3). At the end it evaluates, checkpoints and exports; a stop requested during that still
writes the final checkpoint first.
"""

import contextlib
import logging
import time

import tensorflow as tf

from common.errors import ConfigError, StorageError, TrainingInterrupted
from common.storage_errors import describe
from tpu_utils.loop import make_any_worker, replica_disagreement
from tpu_utils.strategy import io_device_for, is_multi_worker
from training import stop_signals
from training.observers.base import Evaluation, Observer, TrainLoop
from training.observers.standard import RunParts, make_observers
from training.run_directory import identity as run_identity
from training.run_directory.best import BestKeeper
from training.run_directory.checkpoints import CheckpointStore
from training.run_directory.export import export_trainer
from training.run_directory.history import History
from training.run_directory.layout import RunDirectory
from training.run_directory.leftovers import remove_leftovers
from training.trainer import Trainer

log = logging.getLogger(__name__)

REPLICA_TOLERANCE = 1e-5  # Replicas' copies of a weight agree far closer than this (float32 rounding is ~1e-7).


def _drop_partial_restore_warnings(record) -> bool:
    """A logging filter: False for TensorFlow's warnings about a checkpoint whose restore was abandoned."""
    message = record.getMessage()
    return not ("deleted with unrestored values" in message or "could not be found in the restored object" in message)


class Controller:
    """Runs a Trainer to TRAIN_STEPS with the bookkeeping of the run directory. `observers`: the list to call
    instead of the configured one (training/observers/standard.py make_observers), e.g. in a test or a notebook."""

    def __init__(self, trainer: Trainer, run_dir: RunDirectory, *, model_settings: dict | None = None,
                 observers: list[Observer] | None = None):
        self.trainer = trainer
        self.run_dir = run_dir
        self.config = trainer.config
        self.identity = run_identity.run_identity(self.config, model_settings,
                                                  data=run_identity.data_identity(trainer.builder))
        # Non-chief workers save to a temporary folder (they must save too) and resume from the chief's checkpoints.
        self.store = CheckpointStore(trainer.checkpoint, read_dir=run_dir.checkpoint_dir,
                                     write_dir=run_dir.checkpoint_write_dir, keep=self.config.checkpoints_to_keep,
                                     options=tf.train.CheckpointOptions(experimental_io_device=io_device_for(
                                         trainer.strategy, run_dir.checkpoint_write_dir)),
                                     verify_saves=run_dir.is_chief)
        # Every write asks the guard first (training/run_directory/storage_guard.py); a multi-worker save is collective,
        # so one worker cannot retry it alone.
        run_dir.guard.recovery = self.store.previous_phrase
        run_dir.guard.retries = not is_multi_worker(trainer.strategy)
        # Multi-worker: a stop requested on one worker is honoured by all of them at the same loop boundary.
        self._any_worker = make_any_worker(trainer.strategy) if is_multi_worker(trainer.strategy) else bool
        self._saved_step = None  # Step of the newest checkpoint this process wrote or restored.
        self._train_metrics = {}  # Of the last training loop; metrics.json's "train" part.
        self._last_evaluation = None  # The last recorded evaluation's result, {'step', 'train', 'eval'}.
        metric, mode = self.config.best_by()
        evaluated = ("loss", *(each.name for each in trainer.eval_metrics))
        if trainer.ema is not None:  # The EMA weights' under the usual names, the trained ones' as raw_<name>.
            evaluated = (*evaluated, *(f"raw_{name}" for name in evaluated))
        self.history = History(run_dir, metric=metric, mode=mode, evaluated=evaluated)
        # With EVAL_EVERY=0 the sidecar evaluator (--mode=continuous_eval) keeps best/: one writer of it.
        self.best = BestKeeper(trainer, run_dir) if self.config.best_metric and self.config.eval_every else None
        parts = RunParts(trainer=trainer, run_dir=run_dir, store=self.store, history=self.history, best=self.best,
                         any_worker=self._any_worker, model_settings=model_settings or {}, may_write=self._may_write)
        self.observers = make_observers(parts, self.config.observers) if observers is None else list(observers)

    def _notify(self, hook: str, *args) -> None:
        for observer in self.observers:
            getattr(observer, hook)(*args)

    def _may_write(self) -> bool:
        """Whether this run may still write model_dir (its lock held, its storage not failing for too long)."""
        try:
            self.run_dir.guard.check()
        except StorageError:
            return False
        return True

    def _save(self, step: int) -> None:
        """Checkpoints `step` (once), never non-finite state (the loop's finite check ran just before). The run lock
        is read back first; a failing storage is retried (training waits) for experiment.storage_timeout_seconds."""
        if step == self._saved_step:
            return
        guard = self.run_dir.guard

        def attempt():
            guard.check(confirm=True)
            return self.store.save(step, before_commit=lambda: guard.check(confirm=True))

        guard.retry(f"the checkpoint save of step {step}", attempt)
        self._saved_step = step

    def restore(self, *, writable: bool = True) -> int:
        """Restores the newest intact checkpoint if there is one (after checking it belongs to this run), else warm
        starts from INIT_FROM if set (training/warm_start.py); returns the step. Damaged newer checkpoints are
        skipped with a warning; none intact among files is exit 2. The chief of a run that may write model_dir first
        removes what a killed run left there (training/run_directory/leftovers.py)."""
        if writable and self.run_dir.is_chief:
            remove_leftovers(self.run_dir.model_dir)
        latest = self.store.find_restorable(writable=writable and self.run_dir.is_chief)
        previous = self.run_dir.read_json("run_identity.json")
        self.run_dir.read_json("metrics.json")  # A corrupt one is exit 2 now, not after training.
        if latest:
            run_identity.check_resume(previous, self.identity, model_dir=self.run_dir.model_dir,
                                      data_dir=self.config.data_dir)
            try:
                self.trainer.restore(latest)
            except (ValueError, AssertionError, tf.errors.OpError) as error:  # Shapes or dtypes do not fit.
                # The half-done restore would warn about "unrestored values" when it is garbage-collected, after
                # (and burying) the one line that says what to do.
                tf.get_logger().addFilter(_drop_partial_restore_warnings)
                raise run_identity.restore_mismatch_error(previous, self.identity, checkpoint=latest, error=error,
                                                          model_dir=self.run_dir.model_dir) from error
            self._saved_step = self.trainer.step
            log.info("Resumed from %s at step %d.", latest, self.trainer.step)
            if self.config.init_from:
                log.info("INIT_FROM=%r not used: this run resumes from its own checkpoint.", self.config.init_from)
        elif self.config.init_from:  # A new run: model variables from INIT_FROM; optimizer and step stay new.
            self.trainer.warm_start()
        if self.best is not None:
            self.best.resume(writable=writable and self.run_dir.is_chief)
        self.history.resume(self.trainer.step, rewrite=writable)
        return self.trainer.step

    def record_identity(self) -> None:
        """Writes run_identity.json (when it changed): the settings a later resume is checked against."""
        if self.run_dir.read_json("run_identity.json") != self.identity:
            self.run_dir.write_json("run_identity.json", self.identity)

    def restore_for_inference(self, *, writable: bool = True) -> int:
        """Restores the newest intact checkpoint for --mode=eval/export; a ConfigError if there is none."""
        if not self.store.has_files():
            raise ConfigError(f"No checkpoint in {self.run_dir.checkpoint_dir}: train first (--mode=train) or pass "
                              "the --model_dir of a trained run.")
        return self.restore(writable=writable)

    def train_and_evaluate(self) -> dict:
        """Trains from the current step to TRAIN_STEPS; returns the final {'step', 'train', 'eval'} metrics."""
        config, trainer = self.config, self.trainer
        stopped = self._stop_reason() if trainer.step < config.train_steps else None
        if trainer.step >= config.train_steps:
            log.info("Step %d >= TRAIN_STEPS=%d: nothing to train (raise TRAIN_STEPS to continue).", trainer.step,
                     config.train_steps)
        elif stopped:
            log.info("Stopped early at step %d, before this start: %s.", trainer.step, stopped)
        with contextlib.ExitStack() as running:  # Closed also on a stop (exit 3) or a failure (TensorBoard flushes).
            for observer in self.observers:
                running.enter_context(observer.running(trainer.step))
            if trainer.step < config.train_steps and not stopped:
                self._train_loops()
            with stop_signals.honoured():
                last = self._last_evaluation  # An early stop has just evaluated this step.
                final = last if last and last["step"] == trainer.step else self.evaluate()
                self._stop_if_requested(f"after the final evaluation at step {trainer.step}", export_follows=True)
                self._save(trainer.step)
                self.export()
                self._stop_if_requested(f"after the export of step {trainer.step}")
                self.history.flush()  # Records kept through a storage failure: written, or a StorageError.
        self._check_replicas_agree()
        return final

    def _train_loops(self) -> None:
        """Loops to TRAIN_STEPS, evaluating and checkpointing between loops as configured."""
        config, trainer = self.config, self.trainer
        self._notify("loops_start", trainer.step)
        iterator = self._train_iterator()
        with stop_signals.honoured():
            # A stop requested during start-up ends here, before the first loop's compile and steps.
            stop_signals.stop_if_requested("before training started", "nothing was trained or written since")
            try:
                while trainer.step < config.train_steps:
                    self._run_one_loop(iterator)
                    step = trainer.step
                    if step == config.train_steps:
                        break
                    if config.eval_every and step % config.eval_every == 0:
                        self.evaluate()
                    self._stop_if_requested(f"at step {step}")
                    if config.checkpoint_every and step % config.checkpoint_every == 0:
                        self._save(step)
                    stopped = self._stop_reason()
                    if stopped:
                        log.info("Stopped early at step %d: %s.", step, stopped)
                        break
            finally:
                self._notify("loops_end")

    def _stop_reason(self) -> str | None:
        """Why an observer ends training now (early stopping), or None; every worker stops at the same loop."""
        stoppers = [observer for observer in self.observers if type(observer).stop_reason is not Observer.stop_reason]
        if not stoppers:  # No collective between workers for runs that cannot stop early.
            return None
        reason = next((reason for reason in (observer.stop_reason() for observer in stoppers) if reason), None)
        return (reason or "another worker's observer ended training") if self._any_worker(bool(reason)) else None

    def _train_iterator(self):
        """The training iterator; a ConfigError (before any step) when the train split's files cannot be read."""
        try:
            return self.trainer.train_iterator()
        except (tf.errors.DataLossError, tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError) as error:
            data_dir = self.trainer.builder.data_dir
            raise ConfigError(f"The training split in {data_dir} cannot be read ({describe(error, 200)}): a TFRecord "
                              f"file is truncated or corrupt. Delete {data_dir} and rerun to prepare it again (for a "
                              "staged dataset: python -m data.stage ...).") from error

    def _stop_if_requested(self, where: str, *, export_follows: bool = False) -> None:
        """Honours a requested stop (every worker together): checkpoint, then exit 3."""
        if not self._any_worker(stop_signals.requested() is not None):
            return
        self._save(self.trainer.step)
        cause = stop_signals.requested() or "another worker"
        skipped = "; the SavedModel was not exported (the rerun exports it)" if export_follows else ""
        raise TrainingInterrupted(f"Stopped by {cause} {where}; checkpoint {self.store.latest} saved{skipped}. "
                                  "Rerun the same command to resume.")

    def evaluate(self, *, record: bool = True) -> dict:
        """Exact evaluation now; logs it and, when `record`, records it (`record_evaluation`)."""
        started = time.perf_counter()
        evaluation = self.trainer.evaluate()
        step, seconds = self.trainer.step, time.perf_counter() - started
        self._notify("after_evaluation", Evaluation(step=step, metrics=evaluation, seconds=seconds))
        if record:
            self._last_evaluation = self.record_evaluation(step, evaluation, seconds)
            return self._last_evaluation
        return {"step": step, "train": self._train_metrics, "eval": evaluation}

    def record_evaluation(self, step: int, evaluation: dict, seconds: float) -> dict:
        """Records an evaluation: the observers' records (TensorBoard, metrics.jsonl, a new best), then metrics.json."""
        self._notify("record_evaluation", Evaluation(step=step, metrics=evaluation, seconds=seconds))
        if not self._train_metrics:  # --mode=eval, or nothing left to train: keep the recorded training figures.
            self._train_metrics = (self.run_dir.read_json("metrics.json") or {}).get("train", {})
        self.run_dir.write_metrics(step, self._train_metrics, evaluation, best=self.history.best)
        return {"step": step, "train": self._train_metrics, "eval": evaluation}

    def export(self) -> str:
        path = self.run_dir.export_dir(self.trainer.step)  # Every worker exports; only the chief's is kept.
        guard = self.run_dir.guard
        guard.retry(f"the export to {path}", lambda: export_trainer(
            self.trainer, path, recovery=f"nothing was left there. The checkpoint {self.store.latest or '(none)'} is "
            "intact: fix the storage, then rerun with --mode=export.", before_commit=lambda: guard.check(confirm=True)))
        if self.run_dir.is_chief:
            log.info("Exported SavedModel to %s", path)
        return path

    def _check_replicas_agree(self) -> None:
        """Synchronous training keeps every replica's weights equal, on every worker; measures it once at the end."""
        strategy = self.trainer.strategy
        if strategy.num_replicas_in_sync == 1:
            return
        disagreement = replica_disagreement(strategy, self.trainer.model.variables)
        report = log.info if disagreement <= REPLICA_TOLERANCE else log.warning
        report("Replica weights: the %d replicas' copies differ by at most %.1e (relative; tolerance %.0e).",
               strategy.num_replicas_in_sync, disagreement, REPLICA_TOLERANCE)

    def _run_one_loop(self, iterator) -> None:
        config, trainer = self.config, self.trainer
        num_steps = min(config.steps_per_loop, config.train_steps - trainer.step)
        self._notify("before_loop", trainer.step, num_steps)
        started = time.perf_counter()
        metrics = trainer.train(iterator, num_steps)
        seconds = time.perf_counter() - started
        learning_rate = float(tf.convert_to_tensor(trainer.optimizer.learning_rate).numpy())
        self._notify("after_loop", TrainLoop(step=trainer.step, num_steps=num_steps, seconds=seconds, metrics=metrics,
                                             learning_rate=learning_rate, global_batch_size=config.global_batch_size))
        self._train_metrics = metrics
