"""--mode=continuous_eval: a sidecar evaluator that watches a training job's model_dir and evaluates each new
checkpoint exactly once (docs/sidecar_eval.md).

It runs beside the training job (another machine, or a CPU), never takes the training job's run lock and never
writes what the training job writes. Its records are in model_dir/eval_sidecar/:

  eval_sidecar/metrics.jsonl   the ledger: one record per checkpoint step, "eval" (its metrics) or "skipped" (why),
                               appended after the evaluation (training/run_directory/history.py's format and resume)
  eval_sidecar/events.out.*    TensorBoard scalars per evaluation: `tensorboard --logdir runs` shows the run
                               `<run>/eval_sidecar` beside `<run>/train` and `<run>/eval`
  eval_sidecar/run.lock        held while a sidecar runs: one sidecar per model_dir

A checkpoint counts once its step is named in checkpoints/checkpoint (the training job names it only after reading
it back intact). Each is evaluated with the Trainer's own exact, padded evaluation, oldest first (the oldest is the
next to rotate away). Order per checkpoint: evaluate, keep best/ (when this sidecar keeps it), append the ledger
record, then the TensorBoard events. A SIGKILL before the ledger record re-evaluates that checkpoint once after the
restart (same weights, same metrics); on restart, events missing for steps the ledger holds are written then, so
each step has one record and one event. Checkpoints the schedule (CHECKPOINT_EVERY) predicts that rotated away
before the sidecar read them, or that vanish while being read, are recorded as "skipped" with a warning.

best/ has one writer: the training job when it evaluates during training (EVAL_EVERY > 0), this sidecar when
EVAL_EVERY=0 and BEST_METRIC is set (the training job then leaves best/ alone). Both jobs must run with the same
gin files and bindings.

It ends after the checkpoint of TRAIN_STEPS (exit 0), or when no new checkpoint came for
`continuous_eval.timeout_seconds` (exit 0 with a warning; exit 2 if no checkpoint ever appeared), or on SIGTERM
after the current checkpoint's evaluation is recorded (exit 3).
"""

import dataclasses
import logging
import math
import time

import tensorflow as tf

from common.errors import ConfigError
from common.storage_paths import join
from training import stop_signals
from training.observers.progress import eval_table
from training.observers.summaries import Summaries
from training.run_directory import identity as run_identity
from training.run_directory import lock as run_lock
from training.run_directory.best import BestKeeper
from training.run_directory.checkpoints import checkpoint_steps, named_steps, verify
from training.run_directory.history import History, read_records
from training.run_directory.layout import RunDirectory

log = logging.getLogger(__name__)

FOLDER = "eval_sidecar"


@dataclasses.dataclass(frozen=True)
class ContinuousEvalSettings:
    """gin: `continuous_eval.timeout_seconds`, `continuous_eval.poll_seconds`."""

    timeout_seconds: float = 3600  # End after this long without a new checkpoint (also before the first one).
    poll_seconds: float = 10  # How often checkpoints/checkpoint is read (one small read; on gs:// one GET).

    def __post_init__(self):
        for name in ("timeout_seconds", "poll_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigError(f"continuous_eval.{name}={value!r} must be a number of seconds > 0, e.g. "
                                  f"--gin_param=\"continuous_eval.{name}=60\".")


def keeps_best(config) -> bool:
    """Whether the sidecar, not the training job, keeps best/: BEST_METRIC set and EVAL_EVERY=0."""
    return bool(config.best_metric) and not config.eval_every


def _better(value: float, best: dict | None, mode: str) -> bool:
    """Whether `value` beats the best so far under `mode` ('max'/'min'), as History ranks evaluations."""
    return math.isfinite(value) and (best is None or (value > best["value"] if mode == "max"
                                                       else value < best["value"]))


class Sidecar:
    """Watches `run_dir`'s checkpoints and evaluates each new one once with `trainer` (built with training=False)."""

    def __init__(self, trainer, run_dir: RunDirectory, settings: ContinuousEvalSettings, *, identity: dict,
                 clock=time.monotonic):
        self.trainer, self.run_dir, self.settings, self.identity = trainer, run_dir, settings, identity
        self.config = config = trainer.config
        self.clock = clock
        self.records = RunDirectory(run_dir.path(FOLDER), guard=run_dir.guard)
        metric, mode = config.best_by()
        evaluated = ("loss", *(each.name for each in trainer.eval_metrics))
        if trainer.ema is not None:
            evaluated = (*evaluated, *(f"raw_{name}" for name in evaluated))
        self.history = History(self.records, metric=metric, mode=mode, evaluated=evaluated)
        self.summaries = Summaries(self.records)
        self.best = BestKeeper(trainer, run_dir) if keeps_best(config) else None
        self._identity_checked = False
        self._done: set[int] = set()  # Steps the ledger holds (evaluated or skipped).

    def _records(self) -> list[dict]:
        return [record for record in read_records(self.history.path) if record["kind"] in ("eval", "skipped")]

    def resume(self) -> None:
        """Reloads the ledger (dropping a half-written last line) and writes the events a SIGKILL cut off."""
        self.history.resume(2**62)
        if self.best is not None:
            self.best.resume(writable=True)
        elif self.config.best_metric:
            log.info("BEST_METRIC=%r with EVAL_EVERY=%d: best/ is kept by the training job; this sidecar records its "
                     "evaluations only.", self.config.best_metric, self.config.eval_every)
        with_events = _event_steps(self.records.model_dir)
        records = self._records()
        self._done = {record["step"] for record in records}
        for record in records:
            if record["kind"] == "eval" and record["step"] not in with_events:
                self.summaries.scalars("", record["step"], record["metrics"])

    def run(self) -> dict:
        """Evaluates checkpoints until the one of TRAIN_STEPS; returns {'step', 'eval', 'evaluated', 'skipped'}."""
        self.resume()
        if self.run_dir.read_json("run_identity.json") is not None:  # Now, also when the ledger covers TRAIN_STEPS
            self._check_identity()  # already: another configuration's records are not this one's (exit 2).
        checkpoint_dir, train_steps = self.run_dir.checkpoint_dir, self.config.train_steps
        log.info("Watching %s for checkpoints (every %g s; ends after step %d, or %g s without a new one).",
                 checkpoint_dir, self.settings.poll_seconds, train_steps, self.settings.timeout_seconds)
        last_new = self.clock()
        try:
            while max(self._done, default=-1) < train_steps:
                stop_signals.stop_if_requested("while waiting for a checkpoint", "every evaluation so far is "
                                               "recorded")
                ready = [step for step in named_steps(checkpoint_dir) if step > max(self._done, default=0)]
                if ready:
                    self._check_identity()
                    for step in ready:
                        self._skip_missed(step)
                        self._evaluate(step)
                        stop_signals.stop_if_requested(f"after recording the evaluation of step {step}",
                                                       "every evaluation so far is recorded")
                    last_new = self.clock()
                    continue
                if self.clock() - last_new >= self.settings.timeout_seconds:
                    return self._timed_out()
                self._sleep()
        finally:
            self.summaries.flush()
        return self._result()

    def _check_identity(self) -> None:
        """The checkpoints must be of this configuration (run_identity.json, as a resume checks); exit 2 if not."""
        if not self._identity_checked:
            run_identity.check_resume(self.run_dir.read_json("run_identity.json"), self.identity,
                                      model_dir=self.run_dir.model_dir, data_dir=self.config.data_dir)
            self._identity_checked = True

    def _skip_missed(self, step: int) -> None:
        """Records as skipped the steps CHECKPOINT_EVERY predicts between the last recorded one and `step`: they
        rotated away (checkpoints_to_keep) before this sidecar read them."""
        every = self.config.checkpoint_every
        if not every:
            return
        for missed in range(max(self._done, default=0) // every * every + every, step, every):
            self._skip(missed, "rotated away before the sidecar read it")

    def _skip(self, step: int, why: str) -> None:
        log.warning("Checkpoint of step %d not evaluated: %s (recorded as skipped in %s).", step, why,
                    self.history.path)
        self.history.record("skipped", step, {}, reason=why)
        self._done.add(step)

    def _evaluate(self, step: int) -> None:
        path = join(self.run_dir.checkpoint_dir, f"ckpt-{step}")
        reason = verify(path)  # A storage that does not answer is a StorageError (exit 6), never "skipped".
        if reason is None:
            try:
                self.trainer.restore(path)
            except (tf.errors.OpError, ValueError) as error:  # Rotated away between the read-back and the restore?
                if step in checkpoint_steps(self.run_dir.checkpoint_dir):
                    raise
                reason = f"unreadable ({type(error).__name__})"
        if reason is not None:
            gone = step not in checkpoint_steps(self.run_dir.checkpoint_dir)
            self._skip(step, "rotated away while the sidecar read it" if gone else f"damaged: {reason}")
            return
        started = time.perf_counter()
        metrics = self.trainer.evaluate()
        seconds = time.perf_counter() - started
        log.info("%s", eval_table(step, metrics, seconds))
        value = float(metrics[self.history.metric_name])
        if self.best is not None and _better(value, self.history.best, self.history.mode):
            self.best.keep({"step": step, "metric": self.history.metric, "mode": self.history.mode, "value": value})
        self.history.record_eval(step, metrics, seconds)  # The ledger record: from now on this step is done.
        self._done.add(step)
        self.summaries.scalars("", step, metrics)

    def _sleep(self) -> None:
        """Waits poll_seconds, waking early for a stop request (SIGTERM)."""
        until = self.clock() + self.settings.poll_seconds
        while self.clock() < until and not stop_signals.requested():
            time.sleep(min(0.2, self.settings.poll_seconds))

    def _timed_out(self) -> dict:
        timeout = self.settings.timeout_seconds
        if not self._done:
            raise ConfigError(f"No checkpoint appeared in {self.run_dir.checkpoint_dir} within "
                              f"continuous_eval.timeout_seconds={timeout:g}: is --model_dir the training job's (and "
                              "is it running)? To wait longer, raise continuous_eval.timeout_seconds.")
        log.warning("Timed out: no new checkpoint in %s for continuous_eval.timeout_seconds=%g; the last recorded is "
                    "step %d of TRAIN_STEPS=%d. Rerun the same command to go on watching (nothing is evaluated "
                    "twice).", self.run_dir.checkpoint_dir, timeout, max(self._done), self.config.train_steps)
        return {**self._result(), "timed_out": True}

    def _result(self) -> dict:
        records = self._records()
        evaluations = [record for record in records if record["kind"] == "eval"]
        return {"step": evaluations[-1]["step"] if evaluations else None,
                "eval": evaluations[-1]["metrics"] if evaluations else {},
                "evaluated": [record["step"] for record in evaluations],
                "skipped": [record["step"] for record in records if record["kind"] == "skipped"]}


def _event_steps(folder: str) -> set[int]:
    """Steps with scalar events in the TensorBoard files of `folder` (a truncated last record ends that file's read)."""
    steps = set()
    for path in tf.io.gfile.glob(join(folder, "events.out.tfevents.*")):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                if event.summary.value:
                    steps.add(event.step)
        except tf.errors.DataLossError:
            pass
    return steps


def run_sidecar(trainer, run_dir: RunDirectory, settings: ContinuousEvalSettings, *, identity: dict) -> dict:
    """Holds model_dir/eval_sidecar/run.lock (never the training job's lock) while the Sidecar runs."""
    lock = run_lock.make_lock(run_dir.path(FOLDER), storage_timeout_seconds=run_dir.guard.timeout_seconds)
    lock.acquire()
    run_dir.guard.lock = lock
    try:
        return Sidecar(trainer, run_dir, settings, identity=identity).run()
    finally:
        lock.release()
