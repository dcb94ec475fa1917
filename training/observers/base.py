"""What the host loop tells its observers, and when: the seam where progress lines, TensorBoard, metrics.jsonl,
profiling, best-keeping and the finite guard plug into training/controller.py (as Orbit's actions do).

The Controller calls each observer, in list order, at these points (every hook is optional):
- `running(step)`: a context around the whole training and its final evaluation (a progress bar; flushes at its end,
  also on failure);
- `loops_start(step)`: once, before the first training loop of this process;
- `before_loop(step, num_steps)`, then `after_loop(TrainLoop)` around each on-device loop of STEPS_PER_LOOP steps;
- `loops_end()`: after the last loop, also when training stops early or fails;
- `after_evaluation(Evaluation)`: after every evaluation, recorded or not (--mode=eval on a run it cannot write);
- `record_evaluation(Evaluation)`: when an evaluation is recorded in the run directory (also by the sidecar
  evaluator, --mode=continuous_eval, which has no training loops);
- `stop_reason()`: asked before each loop; a non-empty reason ends training there, as if TRAIN_STEPS were reached
  (the final checkpoint and export follow; exit 0), e.g. early stopping.
An observer that raises stops the run (the finite guard raises NonFiniteLossError: exit 4). `chief_only` observers
are made on the chief alone (training/observers/standard.py), so none of them checks which worker it runs on.
Write one for your own logging (docs/make_it_yours.md, "Watch it your way").
"""

import contextlib
import dataclasses


@dataclasses.dataclass(frozen=True)
class TrainLoop:
    """One on-device loop that has just run: `num_steps` steps ending at global step `step`, in `seconds`."""

    step: int
    num_steps: int
    seconds: float
    metrics: dict  # Host floats: 'loss' (the data loss; 'regularization' apart when the model has one) and metrics.
    learning_rate: float
    global_batch_size: int

    @property
    def rates(self) -> dict:
        rate = self.num_steps / self.seconds if self.seconds > 0 else float("inf")
        return {"steps_per_second": rate, "examples_per_second": rate * self.global_batch_size}

    @property
    def scalars(self) -> dict:
        """What is recorded of the loop (TensorBoard's train/ scalars, metrics.jsonl's train record)."""
        return {**self.metrics, "learning_rate": self.learning_rate, **self.rates}


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One exact evaluation of the eval split at global step `step`: {'loss': ..., metric: ...}, in `seconds`."""

    step: int
    metrics: dict
    seconds: float
    new_best: bool = False  # Recorded evaluations: whether it is the best so far by BEST_METRIC (the history ranks).


class Observer:
    """Base class: override the hooks you need (each does nothing here)."""

    chief_only = False  # True: made only on the chief of a multi-worker job (it writes or prints).

    def running(self, step: int):
        return contextlib.nullcontext()

    def loops_start(self, step: int) -> None:
        pass

    def before_loop(self, step: int, num_steps: int) -> None:
        pass

    def after_loop(self, loop: TrainLoop) -> None:
        pass

    def loops_end(self) -> None:
        pass

    def after_evaluation(self, evaluation: Evaluation) -> None:
        pass

    def record_evaluation(self, evaluation: Evaluation) -> None:
        pass

    def stop_reason(self) -> str | None:
        return None
