"""What watching a run costs: the default run's steady-state throughput with the controller's per-loop work (progress
line, metrics.jsonl record, TensorBoard scalars, finite check, learning-rate read) against the bare on-device loops.

    .venv/bin/python bench/observe_overhead.py [--pairs=100] [--gin_param=...]

Builds configs/default.gin (the small CNN on digits, 100 steps per loop) in this process, compiles, then alternates
one bare loop (`Trainer.train` only) and one controller loop (`Controller._run_one_loop`: everything the host does
after a loop except evaluating and checkpointing), `--pairs` times, so drift and neighbours' load hit both alike,
and compares the median loop times. Also prints the host time spent in the observation calls themselves (progress,
history, summaries) per loop: the direct, low-noise measure. Also times the one-off
TensorBoard set-up at the start of a run (config text, hparams, input images). Why a benchmark, not a test: timings
on shared CPUs are noisy; a test asserting them would fail by chance.
"""

import argparse
import functools
import io
import logging
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _timed(totals: dict, name: str, function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - started
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--gin_file", default="configs/default.gin")
    parser.add_argument("--gin_param", action="append", default=[])
    args = parser.parse_args()
    from common.tf_logging import quiet_tensorflow

    quiet_tensorflow()
    config, trainer, controller = _controller(args.gin_file, args.gin_param)
    from training.observers.standard import ProgressLines, TensorBoard

    def observer(kind):
        return next(each for each in controller.observers if isinstance(each, kind))

    progress, tensorboard = observer(ProgressLines).progress, observer(TensorBoard)
    started = time.perf_counter()
    tensorboard.loops_start(trainer.step)  # The one-off TensorBoard set-up of a run.
    set_up = time.perf_counter() - started

    totals = {}
    progress.loop_done = _timed(totals, "progress", progress.loop_done)
    controller.record.history.record = _timed(totals, "history", controller.record.history.record)
    tensorboard.summaries.scalars = _timed(totals, "summaries", tensorboard.summaries.scalars)
    with progress.active(trainer.step):
        bare, full, observed = _pairs(trainer, controller, totals, args.pairs)
    _print(args, config, statistics.median(bare), statistics.median(full), statistics.median(observed), set_up)


def _controller(gin_file: str, gin_params: list[str]):
    """(config, trainer, controller) of `gin_file` in a temporary run directory, logging as train.py does (to
    memory here, not the terminal)."""
    from training import config_files

    config_files.parse([gin_file], ["TRAIN_STEPS=1000000", *gin_params], search_path=config_files.REPO_ROOT)
    from common.tf_logging import PROGRESS_FORMAT, PROGRESS_TIME_FORMAT
    from tpu_utils.strategy import make_strategy
    from training import experiment
    from training.controller import Controller
    from training.run_directory.layout import OPERATIVE_CONFIG, RunDirectory
    from training.run_directory.record import RunRecord
    from training.trainer import Trainer

    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter(PROGRESS_FORMAT, PROGRESS_TIME_FORMAT))
    logging.getLogger("training").addHandler(handler)
    logging.getLogger("training").setLevel(logging.INFO)
    logging.getLogger("training").propagate = False

    config = experiment.experiment()
    trainer = Trainer(config, make_strategy(config.strategy))
    model_dir = tempfile.mkdtemp(prefix="observe-bench-")
    controller = Controller(trainer, RunRecord(trainer, RunDirectory(model_dir),
                                               model_settings=experiment.model_settings(config.model)))
    import gin

    with open(os.path.join(model_dir, OPERATIVE_CONFIG), "w") as handle:
        handle.write(gin.operative_config_str())
    return config, trainer, controller


def _pairs(trainer, controller, totals: dict, pairs: int) -> tuple[list, list, list]:
    """One bare loop, then one controller loop, `pairs` times (drift and load hit both alike): their seconds, and the
    seconds of the observation calls in each controller loop."""
    iterator = trainer.train_iterator()
    controller._run_one_loop(iterator)  # Traces and compiles.
    trainer.train(iterator, trainer.config.steps_per_loop)
    bare, full, observed = [], [], []
    for pair in range(pairs):
        started = time.perf_counter()
        trainer.train(iterator, trainer.config.steps_per_loop)
        bare.append(time.perf_counter() - started)
        totals.clear()
        started = time.perf_counter()
        controller._run_one_loop(iterator)
        full.append(time.perf_counter() - started)
        observed.append(sum(totals.values()))
        if (pair + 1) % 20 == 0:
            print(f"{pair + 1} pairs: bare {1000 * statistics.median(bare):.1f} ms, controller "
                  f"{1000 * statistics.median(full):.1f} ms, observation calls "
                  f"{1000 * statistics.median(observed):.2f} ms per loop (median so far)", flush=True)
    return bare, full, observed


def _print(args, config, bare_loop: float, full_loop: float, calls: float, set_up: float) -> None:
    steps = config.steps_per_loop
    print(f"\n{args.gin_file} {' '.join(args.gin_param)}: {steps} steps per loop, global batch "
          f"{config.global_batch_size}, {args.pairs} pairs of loops (medians)")
    print(f"bare loop        {1000 * bare_loop:7.1f} ms = {steps / bare_loop:6.1f} steps/s")
    print(f"controller loop  {1000 * full_loop:7.1f} ms = {steps / full_loop:6.1f} steps/s: "
          f"{100 * (full_loop / bare_loop - 1):+.2f}% (all host work between loops; the finite check, lr read and 4 "
          "of the 7 scalars existed before)")
    print(f"observation calls (progress line, metrics.jsonl record, TensorBoard scalars): {1000 * calls:.2f} ms per "
          f"loop = {100 * calls / full_loop:.2f}% of a controller loop")
    print(f"one-off at the start (config text, hparams, 8 input images): {1000 * set_up:.0f} ms")


if __name__ == "__main__":
    main()
