"""What watching a run costs: the default run's steady-state throughput with the controller's per-loop work (progress
line, metrics.jsonl record, TensorBoard scalars, finite check, learning-rate read) against the bare on-device loops.

    .venv/bin/python bench/observe_overhead.py [--rounds=6] [--loops=10] [--gin_param=...]

Builds configs/default.gin (the small CNN on digits, 100 steps per loop) in this process, compiles, then alternates
rounds of `--loops` bare loops (`Trainer.train` only) and `--loops` controller loops (`Controller._run_one_loop`:
everything the host does after a loop except evaluating and checkpointing), so drift and neighbours' load hit both
alike. Prints both throughputs, their ratio, and the host time spent in the observation calls themselves (progress,
history, summaries) per loop as a fraction of a loop: the direct, low-noise measure. Also times the one-off
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
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--loops", type=int, default=5)
    parser.add_argument("--gin_file", default="configs/default.gin")
    parser.add_argument("--gin_param", action="append", default=[])
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from training import config_files

    config_files.parse([args.gin_file], ["TRAIN_STEPS=1000000", *args.gin_param], search_path=config_files.REPO_ROOT)
    from tpu_utils.strategy import make_strategy
    from training import experiment
    from training.controller import Controller
    from training.run_directory import RunDirectory
    from training.trainer import Trainer

    # As train.py logs: INFO lines of training.* formatted and written (to memory here, not the terminal).
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logging.getLogger("training").addHandler(handler)
    logging.getLogger("training").setLevel(logging.INFO)
    logging.getLogger("training").propagate = False

    config = experiment.experiment()
    trainer = Trainer(config, make_strategy(config.strategy))
    model_dir = tempfile.mkdtemp(prefix="observe-bench-")
    controller = Controller(trainer, RunDirectory(model_dir), model_settings=experiment.model_settings(config.model))
    with open(os.path.join(model_dir, "operative_config.gin"), "w") as handle:
        import gin

        handle.write(gin.operative_config_str())
    started = time.perf_counter()
    controller._describe_run()
    set_up = time.perf_counter() - started

    totals = {}
    controller.progress.loop_done = _timed(totals, "progress", controller.progress.loop_done)
    controller.history.record = _timed(totals, "history", controller.history.record)
    controller.summaries.scalars = _timed(totals, "summaries", controller.summaries.scalars)
    iterator = trainer.train_iterator()
    steps = config.steps_per_loop
    with controller.progress.active(trainer.step):
        controller._run_one_loop(iterator)  # Traces and compiles.
        trainer.train(iterator, steps)
        bare, full, observed_fraction = [], [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            for _ in range(args.loops):
                trainer.train(iterator, steps)
            bare.append(args.loops * steps / (time.perf_counter() - started))
            totals.clear()
            started = time.perf_counter()
            for _ in range(args.loops):
                controller._run_one_loop(iterator)
            seconds = time.perf_counter() - started
            full.append(args.loops * steps / seconds)
            observed = sum(totals.values())
            observed_fraction.append(observed / seconds)
            print(f"round {len(bare):2d}: bare {bare[-1]:7.1f} steps/s | controller {full[-1]:7.1f} steps/s | "
                  "observation calls "
                  f"{1000 * observed / args.loops:.2f} ms/loop ({100 * observed / seconds:.2f}% of the time: "
                  + ", ".join(f"{name} {1000 * value / args.loops:.2f} ms" for name, value in totals.items()) + ")",
                  flush=True)
    ratio = statistics.median(f / b for f, b in zip(full, bare, strict=True))
    print(f"\n{args.gin_file} {' '.join(args.gin_param)}: {steps} steps per loop, global batch "
          f"{config.global_batch_size}, {args.rounds} rounds of {args.loops} loops each")
    print(f"bare loops       {statistics.median(bare):8.1f} steps/s (median)")
    print(f"controller loops {statistics.median(full):8.1f} steps/s (median); median paired ratio {ratio:.4f} "
          f"({100 * (1 - ratio):+.2f}% slower, noise included; the finite check, lr read and 4 of the 7 scalars "
          "existed before)")
    print(f"observation calls alone (progress, metrics.jsonl, TensorBoard scalars): median "
          f"{100 * statistics.median(observed_fraction):.2f}% of the controller loops' time")
    print(f"one-off at the start (config text, hparams, 8 input images): {1000 * set_up:.0f} ms")


if __name__ == "__main__":
    main()
