"""The run's history: model_dir/metrics.jsonl, one JSON record per training loop and per evaluation, and the ranking
of evaluations by BEST_METRIC (the one place that decides whether an evaluation is the best so far).

    {"kind": "train", "step": 200, "time": 1764553200.1, "metrics": {"loss": ..., "accuracy": ..., "lr": ...}}
    {"kind": "eval", "step": 500, "time": 1764553210.4, "seconds": 1.2, "metrics": {"loss": ..., "accuracy": ...}}

Why a separate file: metrics.json is the latest summary only; curves, comparisons (tools/compare.py) and the best
checkpoint need every point. It survives a kill and resume: on resume, records past the restored step (written
after the checkpoint that is resumed from, so they will be recomputed) and any half-written last line are dropped,
and a record whose (kind, step) is already present is not written again, so the file has no duplicates and no gaps.
Records are appended (on gs:// the object is read and written whole per append, under the run lock's generation
fence, gcs/generation_fence.py: fine for the few hundred loops of a run). An append that fails (a full disk, an
unreachable bucket) may leave half a line behind: the records it held are kept, and the next write rewrites the
whole file (its intact records plus the kept ones, through a temporary file renamed over it), so a later record
never runs into the half line and nothing is lost. Training goes
on meanwhile, until the storage has failed for `experiment.storage_timeout_seconds`
(training/run_directory/storage_guard.py); a run never ends with records it could not write (`flush` raises a
StorageError). A damaged line found on resume is dropped with a warning. Only the chief writes.
"""

import json
import logging
import math
import time

import tensorflow as tf

from common.errors import ConfigError, StorageError
from common.settings import how_to_set
from common.storage_errors import describe
from common.storage_wait import reporting_on_gcs
from training.run_directory.layout import HISTORY as FILE
from training.run_directory.lock_holder import RunLockLost

log = logging.getLogger(__name__)


def improves(value: float, best: float | None, mode: str, min_delta: float = 0.0) -> bool:
    """Whether `value` of the ranked metric beats `best` (None: nothing yet) under `mode` ('max' or 'min') by more
    than `min_delta`; a non-finite value never does. History ranks evaluations and early stopping judges patience
    with it."""
    if not math.isfinite(value):
        return False
    return best is None or (value > best + min_delta if mode == "max" else value < best - min_delta)


def read_records(path: str) -> list[dict]:
    """The records of a metrics.jsonl (local or gs://); unparsable lines (a half-written last one) are skipped."""
    return _read(path)[0]


def _read(path: str) -> tuple[list[dict], int]:
    """(the records of `path`, how many of its lines are not records)."""
    if not tf.io.gfile.exists(path):
        return [], 0
    records, damaged = [], 0
    with tf.io.gfile.GFile(path) as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                damaged += 1
                continue
            if isinstance(record, dict) and "step" in record and "kind" in record:
                records.append(record)
            else:
                damaged += 1
    return records, damaged


class History:
    """Appends records to model_dir/metrics.jsonl and keeps the best evaluation by `metric` ('eval/accuracy')."""

    def __init__(self, run_dir, *, metric: str = "eval/loss", mode: str = "min",
                 evaluated: tuple[str, ...] | None = None, clock=time.time):
        """`metric` ('eval/<name>') and `mode` ('max' or 'min'): what the best evaluation is, as
        `ranked_by` resolves BEST_METRIC and BEST_MODE. `evaluated`: the names an evaluation reports
        ('loss' and the metrics); `metric` must be one of them, checked now rather than at the first evaluation,
        which may be hours of accelerator time away."""
        self.run_dir = run_dir
        self.path = run_dir.path(FILE)
        name = metric.partition("/")[2]
        if evaluated is not None and name not in evaluated:
            raise ConfigError(f"BEST_METRIC={metric!r}: the evaluation reports no {name!r} (it reports "
                              f"{', '.join(evaluated)}). Use one of those, e.g. 'eval/{evaluated[-1]}', or add the "
                              "metric to experiment.metrics.")
        self.metric, self.metric_name, self.mode = metric, name, mode
        self.clock = clock
        self._keys: set = set()
        self._pending: list[dict] = []  # Records not yet written (the storage failed); written with the next one.
        self._rewrite = False  # A failed append may have left half a line: the next write rewrites the file.
        self.best: dict | None = None  # {"step", "metric", "mode", "value"}
        self.evaluations: list[tuple[int, float]] = []  # (step, value of `metric`) of every evaluation kept, in order.

    def resume(self, step: int, *, rewrite: bool = True) -> None:
        """Drops records past `step` (and damaged lines; in the file only when `rewrite`), then reloads the best
        evaluation from what is left."""
        records, damaged = _read(self.path)
        kept = [record for record in records if record["step"] <= step]
        if damaged:
            log.warning("%s: %d damaged line(s) (a write cut short) dropped; the steps they held are missing from it.",
                        self.path, damaged)
        if rewrite and self.run_dir.is_chief and (damaged or len(kept) != len(records)):
            self.run_dir.write_text(FILE, _lines(kept))
            log.info("%s: kept the %d records up to step %d (dropped %d written after that checkpoint).", FILE,
                     len(kept), step, len(records) - len(kept))
        self._keys, self.best, self.evaluations = set(), None, []
        for record in kept:  # An evaluation from before experiment.metrics changed may lack the metric: skipped.
            if record["kind"] == "eval" and self.metric_name in record["metrics"]:
                self.consider(record["step"], record["metrics"])
        self._keys = {(record["kind"], record["step"]) for record in kept}

    def record(self, kind: str, step: int, metrics: dict, **extra) -> bool:
        """Appends a record unless one of this (kind, step) exists; returns whether it was new."""
        if (kind, step) in self._keys:
            return False
        self._keys.add((kind, step))
        record = {"kind": kind, "step": step, "time": round(self.clock(), 3), **extra,
                  "metrics": {key: float(value) for key, value in metrics.items()}}
        if self.run_dir.is_chief:
            self._pending.append(record)
            self._write_pending(f"{kind} step {step}")
        return True

    def _write_pending(self, what: str) -> bool:
        """Appends the kept records (or rewrites the file, after a failed append); True once they are written."""
        guard = self.run_dir.guard
        guard.check()  # The run lock still held, the storage not failing for too long.
        try:
            with reporting_on_gcs(f"{self.path} (the record of {what})", self.path):
                if self._rewrite:  # The intact records, then the kept ones a failed append did not finish.
                    existing = read_records(self.path)
                    written = {(record["kind"], record["step"]) for record in existing}
                    missing = [record for record in self._pending if (record["kind"], record["step"]) not in written]
                    self.run_dir.write_text(FILE, _lines(existing + missing), retry=False)
                elif guard.fenced(self.path) is not None:  # gs:// under the run lock (storage_guard.py).
                    guard.fenced(self.path).append(self.path, _lines(self._pending))
                else:
                    tf.io.gfile.makedirs(self.run_dir.model_dir)
                    with tf.io.gfile.GFile(self.path, "a") as handle:
                        handle.write(_lines(self._pending))
        except (tf.errors.OpError, StorageError) as error:  # Kept, and written with the next record.
            if isinstance(error, RunLockLost):  # Refused: the lock is another run's (gcs/generation_fence.py).
                guard.check()  # Ends the run here (exit 6), as for any write once the lock is lost.
            if not guard.writable:
                raise
            self._rewrite = True
            log.warning("%s: the record of %s not written (%s); kept, and written with the next one.", self.path,
                        what, describe(error.__cause__ or error, 200))
            guard.failed(f"writing {self.path}", error)
            return False
        self._pending, self._rewrite = [], False
        guard.succeeded()
        return True

    def flush(self) -> None:
        """Writes any kept records now; a StorageError if they still cannot be written (a run never ends with a
        gap in its history)."""
        if not self._pending or not self.run_dir.is_chief:
            return
        if not self._write_pending("the end of the run"):
            steps = ", ".join(f"{record['kind']} {record['step']}" for record in self._pending)
            raise StorageError(f"{self.path} lacks the records of {steps}: the storage failed and they could not be "
                               "written. The checkpoints are intact: rerun the same command once the storage is back.")

    def record_eval(self, step: int, metrics: dict, seconds: float) -> bool:
        """Appends an evaluation's record; returns whether it was new."""
        return self.record("eval", step, metrics, seconds=round(seconds, 3))

    def consider(self, step: int, metrics: dict) -> bool:
        """Ranks the evaluation of `step` (before it is recorded: best/ is kept first, so a kill in between
        re-evaluates rather than loses it); returns whether it is the best so far. An evaluation this history
        already holds is not ranked again."""
        if ("eval", step) in self._keys:
            return False
        value = float(metrics[self.metric_name])  # In the evaluated names: checked when this history was made.
        self.evaluations.append((step, value))
        if not improves(value, None if self.best is None else self.best["value"], self.mode):
            return False
        self.best = {"step": step, "metric": self.metric, "mode": self.mode, "value": value}
        return True


def _lines(records: list[dict]) -> str:
    return "".join(json.dumps(record, sort_keys=True) + "\n" for record in records)


BEST_MODES = ("max", "min", "auto")


def check_settings(config) -> None:
    """BEST_METRIC (an evaluation metric, 'eval/<name>'; whether the evaluation reports it is checked when the
    history is made) and BEST_MODE, before the strategy is made (minutes on a TPU)."""
    if config.best_mode not in BEST_MODES:
        raise ConfigError(f"BEST_MODE={config.best_mode!r} must be 'max', 'min' or 'auto'; e.g. "
                          f"{how_to_set('best_mode', 'max')}.")
    metric = config.best_metric
    if metric is not None and not (isinstance(metric, str) and metric.startswith("eval/") and metric[5:]):
        raise ConfigError(f"BEST_METRIC={metric!r} must name an evaluation metric, e.g. "
                          f"{how_to_set('best_metric', 'eval/accuracy')} or 'eval/loss'.")


def ranked_by(config) -> tuple[str, str]:
    """(metric, 'max' or 'min'): what evaluations are ranked by: BEST_METRIC and BEST_MODE resolved, or
    ('eval/loss', 'min') when no BEST_METRIC is set (metrics.json's "best" is then the lowest eval loss)."""
    metric = config.best_metric or "eval/loss"
    return metric, resolve_best_mode(metric, config.best_mode if config.best_metric else "auto")


def resolve_best_mode(metric: str, mode: str) -> str:
    """'max' or 'min' for ranking by `metric`; 'auto' is 'min' for losses and errors, else 'max'."""
    if mode in ("max", "min"):
        return mode
    return "min" if any(word in metric for word in ("loss", "error")) else "max"
