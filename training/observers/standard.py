"""The observers every run has, the registry of observers by name, and how a Controller gets its list.

A run's observers are DEFAULT_OBSERVERS, then the names in `experiment.observers` (yours, registered in OBSERVERS:
docs/make_it_yours.md, "Watch it your way"), in that order. Order matters: the finite guard runs first (nothing is
printed or recorded of a non-finite loop); an evaluation's best/ is kept before its metrics.jsonl record, and that
record is written before its TensorBoard events (a sidecar killed in between re-evaluates it, or writes the
missing events, on restart).
"""

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable

import tensorflow as tf

from common.errors import ConfigError, NonFiniteLossError
from common.registry import lookup
from common.settings import how_to_set, require_int, require_names
from training.observers.base import Evaluation, Observer, TrainLoop
from training.observers.health import DivergenceMonitor, make_finite_check, non_finite_names
from training.observers.profiling import Profiler, start_server
from training.observers.progress import Progress
from training.observers.summaries import Summaries, event_steps
from training.run_directory.history import improves, ranked_by, read_records
from training.run_directory.layout import OPERATIVE_CONFIG, TRAIN_EVENTS

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunParts:
    """What observers may use, built by the Controller: the Trainer and the RunRecord (training/run_directory/
    record.py: its `directory`, `checkpoints`, `history`, `best`, `may_write()`), which every write goes through."""

    trainer: object  # training.trainer.Trainer
    record: object  # training.run_directory.record.RunRecord
    any_worker: Callable[[bool], bool]  # True on every worker if it is True on any (a collective in multi-worker)

    @property
    def config(self):
        return self.trainer.config


class FiniteGuard(Observer):
    """Stops the run (exit 4) after a loop whose loss, weights or optimizer state are not finite, naming the newest
    finite checkpoint; nothing non-finite is ever saved. Warns when the loss diverges."""

    def __init__(self, parts: RunParts):
        self._variables = [*parts.trainer.model.variables, *parts.trainer.optimizer.variables]
        self._all_finite = make_finite_check(self._variables)
        self._divergence = DivergenceMonitor()
        self._store = parts.record.checkpoints

    def after_loop(self, loop: TrainLoop) -> None:
        loss, step = loop.metrics["loss"], loop.step
        if not math.isfinite(loss) or not self._all_finite():
            what = f"Loss became {loss}" if not math.isfinite(loss) else \
                f"Weights or optimizer state became non-finite ({', '.join(non_finite_names(self._variables))})"
            newest, _ = self._store.newest_intact()  # Intact means finite, too.
            resume = (f"The newest finite checkpoint is {newest}. Lower LEARNING_RATE or set "
                      "experiment.clip_global_norm, then rerun to resume from it." if newest else
                      "No checkpoint was written yet. Lower LEARNING_RATE or set experiment.clip_global_norm, then "
                      "rerun: it starts from step 0.")
            raise NonFiniteLossError(f"{what} between steps {step - loop.num_steps} and {step}; nothing was saved "
                                     f"since. {resume}")
        self._divergence.observe(step, loss)


class ProgressLines(Observer):
    """A line per loop (steps/s, examples/s, elapsed, ETA) and a table per evaluation (progress.py)."""

    chief_only = True

    def __init__(self, parts: RunParts):
        self.progress = Progress(parts.config.train_steps, parts.config.global_batch_size)
        self.training = parts.record.role == "train"

    def running(self, step: int):
        return self.progress.active(step) if self.training else contextlib.nullcontext()

    def before_loop(self, step: int, num_steps: int) -> None:
        self.progress.loop_starting(step, num_steps)

    def after_loop(self, loop: TrainLoop) -> None:
        self.progress.loop_done(loop)

    def after_evaluation(self, evaluation: Evaluation) -> None:
        self.progress.show_eval(evaluation.step, evaluation.metrics, evaluation.seconds)


class TensorBoard(Observer):
    """TensorBoard events (training/observers/summaries.py): the run's config and hparams once, input images at step
    0, train/ scalars per loop, scalars per recorded evaluation (eval/; the sidecar's in eval_sidecar/); flushed when
    the run ends, however it ends. At the start, evaluations recorded without their events (a kill in between) get
    them."""

    chief_only = True

    def __init__(self, parts: RunParts):
        self.parts = parts
        self.record = parts.record
        self.summaries = Summaries(parts.record.records)

    def running(self, step: int):
        self._write_missing_events()
        return _finally(self.summaries.flush)

    def _write_missing_events(self) -> None:
        record = self.record
        recorded = {entry["step"]: entry["metrics"] for entry in read_records(record.history.path)
                    if entry["kind"] == "eval"}
        if recorded:
            folder = record.records.path(record.eval_events) if record.eval_events else record.records.model_dir
            for step in sorted(set(recorded) - event_steps(folder)):
                self.summaries.scalars(record.eval_events, step, recorded[step])

    def loops_start(self, step: int) -> None:
        directory, trainer = self.record.directory, self.parts.trainer
        path = directory.path(OPERATIVE_CONFIG)
        if tf.io.gfile.exists(path):
            with tf.io.gfile.GFile(path) as handle:
                self.summaries.config_text(step, handle.read())
        self.summaries.hparams(step, {**dataclasses.asdict(trainer.config), **self.record.model_settings},
                               list(trainer.evaluated_names))
        if step == 0:
            self.summaries.input_images(0, trainer.task, trainer.builder, trainer.dataset_spec.eval_split)

    def after_loop(self, loop: TrainLoop) -> None:
        self.summaries.scalars(TRAIN_EVENTS, loop.step, loop.scalars)

    def record_evaluation(self, evaluation: Evaluation) -> None:
        self.summaries.scalars(self.record.eval_events, evaluation.step, evaluation.metrics)


class Profiling(Observer):
    """The PROFILE_STEPS trace and the PROFILER_PORT server (training/observers/profiling.py)."""

    chief_only = True

    def __init__(self, parts: RunParts):
        self.profiler = Profiler(parts.config.profile_steps, parts.record.directory.model_dir,
                                 may_write=parts.record.may_write)
        self.port = parts.config.profiler_port

    def loops_start(self, step: int) -> None:
        start_server(self.port)

    def before_loop(self, step: int, num_steps: int) -> None:
        self.profiler.before_loop(step, num_steps)

    def after_loop(self, loop: TrainLoop) -> None:
        self.profiler.after_loop(loop.step)

    def loops_end(self) -> None:
        self.profiler.stop()  # Also when training stops inside PROFILE_STEPS: the trace is written.


class HistoryRecords(Observer):
    """metrics.jsonl: a record per loop and per recorded evaluation (training/run_directory/history.py), which also
    ranks evaluations by BEST_METRIC."""

    def __init__(self, parts: RunParts):
        self.history = parts.record.history

    def after_loop(self, loop: TrainLoop) -> None:
        self.history.record("train", loop.step, loop.scalars, seconds=round(loop.seconds, 4))

    def record_evaluation(self, evaluation: Evaluation) -> None:
        self.history.record_eval(evaluation.step, evaluation.metrics, evaluation.seconds)


class BestKeeping(Observer):
    """With BEST_METRIC: checkpoints and exports a new best evaluation to best/ and export/best/, in the process that
    keeps best/ (training/run_directory/record.py keeps_best). The chief's history decides for every worker (they
    all save, or none does: saving is collective)."""

    def __init__(self, parts: RunParts):
        self.record, self.any_worker = parts.record, parts.any_worker

    def record_evaluation(self, evaluation: Evaluation) -> None:
        chief = self.record.is_chief
        if self.any_worker(evaluation.new_best and chief):
            self.record.best.keep(self.record.history.best if chief else {"step": evaluation.step})


class EarlyStopping(Observer):
    """With EARLY_STOP_PATIENCE=N: training ends once the last N evaluations have not improved BEST_METRIC by more
    than experiment.early_stop_min_delta over the best before them. Read from the run's history, so a rerun of a
    run that stopped early stops again before training (it does not train on); the best stays in best/ and
    export/best/ (BEST_METRIC's best-keeping)."""

    def __init__(self, parts: RunParts):
        config = parts.config
        self.history, self.patience, self.min_delta = parts.record.history, config.early_stop_patience, \
            config.early_stop_min_delta
        self.metric, self.mode = ranked_by(config)

    def stop_reason(self) -> str | None:
        best = best_step = None
        stale = 0
        for step, value in self.history.evaluations:
            if improves(value, best, self.mode, self.min_delta):
                best, best_step, stale = value, step, 0
            else:
                stale += 1
        if best is None or stale < self.patience:
            return None
        by = f" by more than {self.min_delta:g}" if self.min_delta else ""
        return (f"{self.metric} has not improved{by} in the last {stale} evaluations (best {best:.4f} at step "
                f"{best_step}; EARLY_STOP_PATIENCE={self.patience}). The best model is in best/ and export/best/; to "
                "train on, raise EARLY_STOP_PATIENCE or set it to 0")


# Observers by name (`experiment.observers`): a class taking RunParts, or a function of RunParts that returns an
# Observer, or None when it does not apply to this run.
OBSERVERS: dict[str, Callable[[RunParts], Observer | None]] = {
    "finite_guard": FiniteGuard,
    "profiling": Profiling,
    "progress": ProgressLines,
    "tensorboard": TensorBoard,
    "history": HistoryRecords,
    "best": lambda parts: BestKeeping(parts) if parts.record.best is not None else None,
    "early_stopping": lambda parts: EarlyStopping(parts) if parts.config.early_stop_patience else None,
}
DEFAULT_OBSERVERS = ("finite_guard", "profiling", "progress", "best", "history", "tensorboard", "early_stopping")


def make_observers(parts: RunParts, extra: tuple[str, ...] = ()) -> list[Observer]:
    """DEFAULT_OBSERVERS then `extra` (experiment.observers), built for this run; chief-only ones on the chief only.
    An unknown name is a ConfigError listing the known ones."""
    observers = []
    for name in (*DEFAULT_OBSERVERS, *extra):
        factory = lookup(OBSERVERS, name, named=f"experiment.observers entry {name!r}", known="observers",
                         where="training/observers/standard.py (OBSERVERS)")
        observer = factory(parts)
        if observer is not None and (parts.record.is_chief or not observer.chief_only):
            observers.append(observer)
    return observers


class _finally:
    """A context manager that calls `action` on exit, however the body ends."""

    def __init__(self, action):
        self.action = action

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.action()
        return False


def check_settings(config) -> dict:
    """experiment.observers (names; looked up when the observers are made) and early stopping: EARLY_STOP_PATIENCE
    needs BEST_METRIC and evaluations during training; experiment.early_stop_min_delta >= 0."""
    observers = require_names("observers", config.observers, "['my_logger']")
    require_int("early_stop_patience", config.early_stop_patience, minimum=0, example=0)
    if config.early_stop_patience:
        if not config.best_metric:
            raise ConfigError(f"EARLY_STOP_PATIENCE={config.early_stop_patience} needs BEST_METRIC, the metric that "
                              f"must improve; e.g. {how_to_set('best_metric', 'eval/accuracy')}.")
        if not config.eval_every:
            raise ConfigError(f"EARLY_STOP_PATIENCE={config.early_stop_patience} needs evaluations during training: "
                              f"set EVAL_EVERY, e.g. {how_to_set('eval_every', config.steps_per_loop * 5)}.")
    delta = config.early_stop_min_delta
    if not isinstance(delta, (int, float)) or isinstance(delta, bool) or not 0 <= delta < math.inf:
        raise ConfigError(f"experiment.early_stop_min_delta={delta!r} must be a number >= 0; e.g. "
                          f"{how_to_set('early_stop_min_delta', 0.001)}.")
    return {"observers": observers}
