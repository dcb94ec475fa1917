"""The host loop: the only code that decides when to train, evaluate, checkpoint and export, and that tells the
observers (training/observers/: the finite guard, profiling, progress lines, best-keeping, metrics.jsonl,
TensorBoard, early stopping; yours through `experiment.observers`) what happened. One loop for every mode:

- train: on-device loops of STEPS_PER_LOOP steps to TRAIN_STEPS, an evaluation every EVAL_EVERY steps, a checkpoint
  every CHECKPOINT_EVERY steps, SIGTERM/SIGINT honoured (checkpoint, exit 3); at the end evaluate, checkpoint, export.
- eval: one evaluation of the restored checkpoint, recorded like any other.
- continuous_eval (the sidecar evaluator, docs/sidecar_eval.md): waits for the training job's checkpoints instead of
  training them, and evaluates each once through the same evaluation and observers; its records go to
  eval_sidecar/. It ends after TRAIN_STEPS's checkpoint (exit 0), after `continuous_eval.timeout_seconds` without a
  new one (exit 0; exit 2 if none ever came), or on SIGTERM once the current evaluation is recorded (exit 3).

Every write goes through the RunRecord (training/run_directory/record.py).
"""

import contextlib
import dataclasses
import logging
import math
import time

import tensorflow as tf

from common.errors import ConfigError, TrainingInterrupted
from common.settings import MAX_STEPS, how_to_set, require_int, setting
from common.storage_errors import describe
from tpu_utils.loop import make_any_worker, replica_disagreement
from tpu_utils.strategy import is_multi_worker
from training import stop_signals
from training.observers.base import Evaluation, Observer, TrainLoop
from training.observers.standard import RunParts, make_observers
from training.run_directory.record import RunRecord
from training.trainer import Trainer

log = logging.getLogger(__name__)

REPLICA_TOLERANCE = 1e-5  # Replicas' copies of a weight agree far closer than this (float32 rounding is ~1e-7).


@dataclasses.dataclass(frozen=True)
class ContinuousEvalSettings:
    """gin: `continuous_eval.timeout_seconds`, `continuous_eval.poll_seconds` (--mode=continuous_eval)."""

    timeout_seconds: float = 3600  # End after this long without a new checkpoint (also before the first one).
    poll_seconds: float = 10  # How often checkpoints/checkpoint is read (one small read; on gs:// one GET).

    def __post_init__(self):
        for name in ("timeout_seconds", "poll_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigError(f"continuous_eval.{name}={value!r} must be a number of seconds > 0, e.g. "
                                  f"--gin_param=\"continuous_eval.{name}=60\".")


class Controller:
    """Runs a Trainer in one mode with the bookkeeping of its RunRecord. `observers`: the list to call instead of
    the configured one (training/observers/standard.py make_observers), e.g. in a test or a notebook."""

    def __init__(self, trainer: Trainer, record: RunRecord, *, observers: list[Observer] | None = None):
        self.trainer, self.record, self.config = trainer, record, trainer.config
        # Multi-worker: a stop requested on one worker is honoured by all of them at the same loop boundary.
        self._any_worker = make_any_worker(trainer.strategy) if is_multi_worker(trainer.strategy) else bool
        self._train_metrics = {}  # Of the last training loop; metrics.json's "train" part.
        self._last_evaluation = None  # The last recorded evaluation's result, {'step', 'train', 'eval'}.
        parts = RunParts(trainer=trainer, record=record, any_worker=self._any_worker)
        self.observers = make_observers(parts, self.config.observers) if observers is None else list(observers)

    def _notify(self, hook: str, *args) -> None:
        for observer in self.observers:
            getattr(observer, hook)(*args)

    @contextlib.contextmanager
    def _running(self, step: int):
        """The observers' `running` contexts, closed also on a stop (exit 3) or a failure (TensorBoard flushes)."""
        with contextlib.ExitStack() as running:
            for observer in self.observers:
                running.enter_context(observer.running(step))
            yield

    # --- train

    def train_and_evaluate(self) -> dict:
        """Trains from the current step to TRAIN_STEPS; returns the final {'step', 'train', 'eval'} metrics."""
        config, trainer = self.config, self.trainer
        stopped = self._stop_reason() if trainer.step < config.train_steps else None
        if trainer.step >= config.train_steps:
            log.info("Step %d >= TRAIN_STEPS=%d: nothing to train (raise TRAIN_STEPS to continue).", trainer.step,
                     config.train_steps)
        elif stopped:
            log.info("Stopped early at step %d, before this start: %s.", trainer.step, stopped)
        with self._running(trainer.step):
            if trainer.step < config.train_steps and not stopped:
                self._train_loops()
            with stop_signals.honoured():
                last = self._last_evaluation  # An early stop has just evaluated this step.
                final = last if last and last["step"] == trainer.step else self.evaluate()
                self._stop_if_requested(f"after the final evaluation at step {trainer.step}", export_follows=True)
                self.record.save(trainer.step)
                self.record.export()
                self._stop_if_requested(f"after the export of step {trainer.step}")
                self.record.history.flush()  # Records kept through a storage failure: written, or a StorageError.
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
                        self.record.save(step)
                    stopped = self._stop_reason()
                    if stopped:
                        log.info("Stopped early at step %d: %s.", step, stopped)
                        break
            finally:
                self._notify("loops_end")

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
                              "staged dataset: python -m stage ...).") from error

    def _stop_if_requested(self, where: str, *, export_follows: bool = False) -> None:
        """Honours a requested stop (every worker together): checkpoint, then exit 3."""
        if not self._any_worker(stop_signals.requested() is not None):
            return
        self.record.save(self.trainer.step)
        cause = stop_signals.requested() or "another worker"
        skipped = "; the SavedModel was not exported (the rerun exports it)" if export_follows else ""
        raise TrainingInterrupted(f"Stopped by {cause} {where}; checkpoint {self.record.checkpoints.latest} saved"
                                  f"{skipped}. Rerun the same command to resume.")

    def _check_replicas_agree(self) -> None:
        """Synchronous training keeps every replica's weights equal, on every worker; measures it once at the end."""
        strategy = self.trainer.strategy
        if strategy.num_replicas_in_sync == 1:
            return
        disagreement = replica_disagreement(strategy, self.trainer.model.variables)
        report = log.info if disagreement <= REPLICA_TOLERANCE else log.warning
        report("Replica weights: the %d replicas' copies differ by at most %.1e (relative; tolerance %.0e).",
               strategy.num_replicas_in_sync, disagreement, REPLICA_TOLERANCE)

    # --- evaluate

    def evaluate(self, *, record: bool = True) -> dict:
        """Exact evaluation now; the observers see it and, when `record`, it is recorded (`record_evaluation`)."""
        started = time.perf_counter()
        evaluation = self.trainer.evaluate()
        step, seconds = self.trainer.step, time.perf_counter() - started
        self._notify("after_evaluation", Evaluation(step=step, metrics=evaluation, seconds=seconds))
        if not record:
            return {"step": step, "train": self._train_metrics, "eval": evaluation}
        self._last_evaluation = self.record_evaluation(step, evaluation, seconds)
        return self._last_evaluation

    def record_evaluation(self, step: int, evaluation: dict, seconds: float) -> dict:
        """Ranks the evaluation (the history decides whether it is the best so far), lets the observers record it
        (best/, metrics.jsonl, TensorBoard), then rewrites metrics.json."""
        new_best = self.record.history.consider(step, evaluation)
        self._notify("record_evaluation", Evaluation(step=step, metrics=evaluation, seconds=seconds,
                                                     new_best=new_best))
        return self.record.write_summary(step, self._train_metrics, evaluation)

    def evaluate_once(self, *, recorded: bool) -> dict:
        """--mode=eval: evaluates once; a failure to record it is a warning (the metrics were printed), not a rerun."""
        from common.errors import StorageError

        started = time.perf_counter()
        result = self.evaluate(record=False)
        if not recorded:
            return result
        try:
            return self.record_evaluation(result["step"], result["eval"], time.perf_counter() - started)
        except StorageError as error:
            log.warning("%s The metrics above were computed but not recorded.", error)
            return result

    # --- continuous_eval

    def evaluate_continuously(self, settings: ContinuousEvalSettings, *, clock=time.monotonic) -> dict:
        """The sidecar: evaluates each checkpoint the training job names, oldest first, until TRAIN_STEPS's; returns
        {'step', 'eval', 'evaluated', 'skipped'}. A SIGKILL before an evaluation's record re-evaluates it once on
        restart; the TensorBoard observer writes events a kill cut off after the record."""
        record, train_steps = self.record, self.config.train_steps
        done = record.resume_records()
        if record.has_identity():  # Also when the ledger covers TRAIN_STEPS already: another configuration's
            record.check_identity()  # records are not this one's (exit 2).
        log.info("Watching %s for checkpoints (every %g s; ends after step %d, or %g s without a new one).",
                 record.directory.checkpoint_dir, settings.poll_seconds, train_steps, settings.timeout_seconds)
        last_new = clock()
        with self._running(max(done, default=0)):
            while max(done, default=-1) < train_steps:
                stop_signals.stop_if_requested("while waiting for a checkpoint", "every evaluation so far is recorded")
                ready = record.ready_steps(after=max(done, default=0))
                if not ready:
                    if clock() - last_new >= settings.timeout_seconds:
                        return self._timed_out(done, settings.timeout_seconds)
                    self._sleep(settings.poll_seconds, clock)
                    continue
                record.check_identity()  # The training job may have been resumed with other settings.
                for step in ready:
                    for missed in self._predicted_between(max(done, default=0), step):
                        record.skip(missed, "rotated away before the sidecar read it")
                        done.add(missed)
                    self._evaluate_checkpoint(step)
                    done.add(step)
                    stop_signals.stop_if_requested(f"after recording the evaluation of step {step}",
                                                   "every evaluation so far is recorded")
                last_new = clock()
        return self._sidecar_result()

    def _predicted_between(self, last: int, step: int) -> range:
        """The checkpoint steps CHECKPOINT_EVERY predicts after `last` and before `step`: a sidecar that sees `step`
        next missed them (they rotated away, checkpoints_to_keep, before it read them)."""
        every = self.config.checkpoint_every
        return range(last // every * every + every, step, every) if every else range(0)

    def _evaluate_checkpoint(self, step: int) -> None:
        """Restores the checkpoint of `step` and evaluates it, recorded; or records why it was skipped."""
        reason = self.record.restore_step(step)
        if reason is not None:
            self.record.skip(step, reason)
            return
        self.evaluate()

    @staticmethod
    def _sleep(seconds: float, clock) -> None:
        """Waits `seconds`, waking early for a stop request (SIGTERM)."""
        until = clock() + seconds
        while clock() < until and not stop_signals.requested():
            time.sleep(min(0.2, seconds))

    def _timed_out(self, done: set[int], timeout: float) -> dict:
        if not done:
            raise ConfigError(f"No checkpoint appeared in {self.record.directory.checkpoint_dir} within "
                              f"continuous_eval.timeout_seconds={timeout:g}: is --model_dir the training job's (and "
                              "is it running)? To wait longer, raise continuous_eval.timeout_seconds.")
        log.warning("Timed out: no new checkpoint in %s for continuous_eval.timeout_seconds=%g; the last recorded is "
                    "step %d of TRAIN_STEPS=%d. Rerun the same command to go on watching (nothing is evaluated "
                    "twice).", self.record.directory.checkpoint_dir, timeout, max(done), self.config.train_steps)
        return {**self._sidecar_result(), "timed_out": True}

    def _sidecar_result(self) -> dict:
        ledger = self.record.ledger()
        evaluations = [record for record in ledger if record["kind"] == "eval"]
        return {"step": evaluations[-1]["step"] if evaluations else None,
                "eval": evaluations[-1]["metrics"] if evaluations else {},
                "evaluated": [record["step"] for record in evaluations],
                "skipped": [record["step"] for record in ledger if record["kind"] == "skipped"]}


def check_settings(config) -> None:
    """TRAIN_STEPS, STEPS_PER_LOOP, CHECKPOINT_EVERY and EVAL_EVERY: step counts the device can hold, the last two
    multiples of STEPS_PER_LOOP (the host only acts between loops)."""
    for name, minimum, example in (("train_steps", 1, 1000), ("steps_per_loop", 1, 100), ("checkpoint_every", 0, 1000),
                                   ("eval_every", 0, 1000)):
        require_int(name, getattr(config, name), minimum=minimum, example=example, maximum=MAX_STEPS,
                    why="2**31 - 1: step counts are int32 on the device")
    for name in ("checkpoint_every", "eval_every"):
        value = getattr(config, name)
        if value % config.steps_per_loop:
            nearest = max(1, round(value / config.steps_per_loop)) * config.steps_per_loop
            raise ConfigError(f"{setting(name)}={value} must be a multiple of STEPS_PER_LOOP={config.steps_per_loop} "
                              f"(the host only acts between loops); e.g. {how_to_set(name, nearest)}.")
