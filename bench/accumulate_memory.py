"""What gradient accumulation saves: peak RSS of a wide MLP at ACCUMULATE_STEPS=1 vs 4, same global batch.

    .venv/bin/python bench/accumulate_memory.py [--accumulate=1,4] [--hidden=32768] [--batch=1024] [--steps=5]

Each k runs in its own process (peak RSS, resource.getrusage's ru_maxrss, only ever grows, so one process per
measurement): it builds a Trainer for configs/experiments/digits_mlp.gin with one hidden layer of `--hidden` units
(few weights, large activations: batch x hidden floats per tensor) and GLOBAL_BATCH_SIZE=`--batch`, records the
peak RSS after building (weights, optimizer, data, the process's TensorFlow), then after `--steps` training steps
(compiled and run). The difference is what training adds, mostly the activations and their gradients of one
micro-batch: at k=4 the step holds a quarter of the batch's activations at a time (training/learning/accumulation.py
runs the micro-batches one after another). A benchmark, not a test: the figures depend on the allocator and the
machine; docs/throughput.md states the measured ones.
"""

import argparse
import json
import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIN_FILE = "configs/experiments/digits_mlp.gin"


def peak_rss_mib() -> float:
    """This process's peak resident set so far, MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(accumulate: int, hidden: int, batch: int, steps: int) -> dict:
    """Builds and trains in this process; returns the peak RSS after the build and after the steps."""
    from common.tf_logging import quiet_tensorflow  # Before TensorFlow loads: its C++ start-up lines off.

    quiet_tensorflow()
    from training import config_files

    config_files.parse([GIN_FILE], [f"mlp.hidden_units=({hidden},)", f"GLOBAL_BATCH_SIZE={batch}",
                                    f"ACCUMULATE_STEPS={accumulate}", "experiment.lr_schedule='constant'",
                                    "experiment.train_data_on_device='never'"],
                       search_path=config_files.REPO_ROOT)
    from tpu_utils.strategy import make_strategy
    from training import experiment
    from training.trainer import Trainer

    trainer = Trainer(experiment.experiment(), make_strategy("default"),
                      bound_arguments=experiment.bound_model_arguments)
    iterator = trainer.train_iterator()
    built = peak_rss_mib()
    loss = trainer.train(iterator, steps)["loss"]
    return {"k": accumulate, "built_mib": built, "peak_mib": peak_rss_mib(), "loss": loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accumulate", default="1,4")
    parser.add_argument("--hidden", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.hidden, args.batch, args.steps)))
        return
    results = []
    for accumulate in (int(value) for value in args.accumulate.split(",")):
        command = [sys.executable, os.path.abspath(__file__), f"--child={accumulate}", f"--hidden={args.hidden}",
                   f"--batch={args.batch}", f"--steps={args.steps}"]
        result = subprocess.run(command, capture_output=True, text=True, check=False,
                                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if result.returncode:
            sys.exit(f"k={accumulate} failed:\n{result.stderr[-3000:]}")
        results.append(json.loads(result.stdout.strip().splitlines()[-1]))
    print(f"wide MLP: 64 -> {args.hidden} -> 10, GLOBAL_BATCH_SIZE={args.batch}, {args.steps} steps, float32, CPU")
    print("| ACCUMULATE_STEPS | micro-batch | peak RSS after build | peak RSS after training | added by training |")
    print("|---|---|---|---|---|")
    for row in results:
        print(f"| {row['k']} | {args.batch // row['k']} | {row['built_mib']:,.0f} MiB | {row['peak_mib']:,.0f} MiB | "
              f"{row['peak_mib'] - row['built_mib']:,.0f} MiB |")
    first, last = results[0], results[-1]
    saved = (first["peak_mib"] - first["built_mib"]) - (last["peak_mib"] - last["built_mib"])
    print(f"k={last['k']} saves {saved:,.0f} MiB of training memory against k={first['k']} "
          f"({saved / max(first['peak_mib'] - first['built_mib'], 1e-9):.0%}); loss {first['loss']:.6f} vs "
          f"{last['loss']:.6f}")


if __name__ == "__main__":
    main()
