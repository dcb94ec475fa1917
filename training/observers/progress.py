"""Progress of a run as a person watching it needs it: elapsed time, steps/s, examples/s and an ETA per loop.

Why: a loop line with only loss and throughput says neither how long is left nor why the first loop is slow. The
first loop of a process traces and compiles the training loop; it is announced before it starts, and its time is
reported apart and left out of the ETA, which is the remaining steps over a moving average of the later loops'
steps/s (`WINDOW` loops). On an interactive terminal the loop lines become one updating progress line (tqdm, which
TFDS already installs; other log lines are printed above it); otherwise (Colab cells, TPU VM logs, CI, files) each
loop is one plain log line. Only the chief prints: the ProgressLines observer is made on the chief alone.
"""

import collections
import contextlib
import logging
import os
import shutil
import sys
import time

log = logging.getLogger(__name__)

WINDOW = 5  # Loops in the moving average behind steps/s for the ETA.


def format_duration(seconds: float) -> str:
    """3725 -> '1:02:05'; under an hour '2:05'."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def format_metrics(metrics: dict) -> str:
    return " | ".join(f"{name} {value:.4f}" for name, value in metrics.items())


def eval_table(step: int, metrics: dict, seconds: float) -> str:
    """The evaluation as a small table (first line 'eval step N ...', then one row per metric)."""
    width = max(len(name) for name in metrics)
    rows = [f"eval step {step} ({seconds:.1f} s)", f"  {'metric':<{width}}  value"]
    rows += [f"  {name:<{width}}  {value:.4f}" for name, value in metrics.items()]
    if any(name.startswith("raw_") for name in metrics):  # EMA_DECAY is set (training/learning/ema.py).
        rows.append("  (EMA_DECAY: the unprefixed rows are the averaged weights', which BEST_METRIC ranks and the "
                    "export serves; raw_*: the trained weights')")
    return "\n".join(rows)


class Progress:
    """Times the training loops of one process and prints them.

    `clock` is injectable so the ETA can be tested with known step times; `interactive` defaults to whether stdout
    is a terminal.
    """

    def __init__(self, train_steps: int, global_batch_size: int, *, interactive: bool | None = None,
                 clock=time.perf_counter, stream=None):
        self.train_steps = train_steps
        self.global_batch_size = global_batch_size
        self.stream = stream or sys.stdout
        self.interactive = _is_terminal(self.stream) if interactive is None else interactive
        self.clock = clock
        self._started = None
        self._loops = 0
        self._rates = collections.deque(maxlen=WINDOW)  # steps/s of the loops after the first.
        self._bar = None

    @contextlib.contextmanager
    def active(self, step: int):
        """Around the training: starts the clock at `step`; on a terminal, shows the progress line meanwhile."""
        self._started = self.clock()
        if not self.interactive:
            yield self
            return
        try:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm
        except ImportError:  # pragma: no cover - TFDS depends on tqdm; plain lines are the fallback.
            self.interactive = False
            yield self
            return
        # A pseudo-terminal may report 0 columns: then 120. Longer lines are cut to the width (a wrapped line
        # cannot be redrawn in place).
        width = shutil.get_terminal_size((120, 24)).columns or 120
        with logging_redirect_tqdm(), tqdm(total=self.train_steps, initial=step, file=self.stream, unit="step",
                                           ncols=width, bar_format="{bar:12} {desc}", leave=True) as bar:
            self._bar = bar
            try:
                yield self
            finally:
                self._bar = None

    def loop_starting(self, step: int, num_steps: int) -> None:
        """Announces the first loop, which traces and compiles before it runs."""
        if self._loops == 0:
            log.info("step %d: tracing and compiling the training loop, then running its first %d steps (this loop's "
                     "time includes the compile and is reported apart) ...", step, num_steps)

    def loop_done(self, loop) -> None:
        """Records a loop (training/observers/base.py TrainLoop: its step, seconds, rates) and prints its line."""
        self._loops += 1
        first = self._loops == 1
        rates = loop.rates
        if not first:
            self._rates.append(rates["steps_per_second"])
        text = self.line(loop.step, loop.metrics, loop.learning_rate, rates, seconds=loop.seconds, first=first)
        if self._bar is not None:
            self._bar.n = loop.step
            self._bar.set_description_str(text, refresh=True)
        else:
            log.info("%s", text)

    def eta_seconds(self, step: int) -> float | None:
        """Seconds to TRAIN_STEPS at the moving-average rate of the loops after the first; None before one."""
        if not self._rates:
            return None
        return (self.train_steps - step) / (sum(self._rates) / len(self._rates))

    def elapsed(self) -> float:
        return self.clock() - self._started if self._started is not None else 0.0

    def line(self, step: int, metrics: dict, learning_rate: float, rates: dict, *, seconds: float,
             first: bool) -> str:
        """The loop's line; on a terminal the timing comes first, so a line cut to the width keeps the ETA."""
        eta = self.eta_seconds(step)
        timing = f"first loop {seconds:.1f} s incl. compile" if first else \
            f"{rates['steps_per_second']:.1f} steps/s | {rates['examples_per_second']:,.0f} examples/s"
        clock = (f"elapsed {format_duration(self.elapsed())} | "
                 f"ETA {format_duration(eta) if eta is not None else 'after the next loop'}")
        values = f"{format_metrics(metrics)} | lr {learning_rate:.4g}"
        head = f"step {step:>{len(str(self.train_steps))}}/{self.train_steps}"
        if self.interactive:
            return f"{head} | {clock} | {timing} | {values}"
        return f"{head} | {values} | {timing} | {clock}"

    def show_eval(self, step: int, metrics: dict, seconds: float) -> None:
        log.info("%s", eval_table(step, metrics, seconds))  # Printed above the progress line, if any.


def _is_terminal(stream) -> bool:
    """A terminal with a known width (a pseudo-terminal of size 0 x 0, as `script` gives, gets plain lines)."""
    try:
        return stream.isatty() and os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):
        return False
