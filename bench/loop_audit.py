"""What the training loop adds per step over a bare loop: the template's loop with its parts taken out one at a time.

    python bench/loop_audit.py                          # MLP and CNN, batch 32 and 64, 1 and 2 replicas
    python bench/loop_audit.py --models=mlp --batches=32 --replicas=2 --repetitions=5

Every variant runs STEPS steps of the same model on the same batches (the train split on the devices,
data/device_split.py, so no input pipeline is timed) inside one compiled loop:
  template         Trainer's loop as training runs it (metrics updated, each step's loss summed over replicas);
  no metrics       the train metrics (accuracy) not updated;
  no loss sum      the per-step loss not returned nor summed over replicas (what logging needs);
  bare             neither: forward, backward and the optimizer update only.
Examples/s, median of interleaved repetitions; the last row is template / bare (1.00 = the loop costs nothing).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from throughput import _config  # noqa: E402 - bench/ is on the path when run as a script.

STEPS = 300


def variants(trainer) -> dict:
    """name -> compiled loop(source, num_steps), all sharing the Trainer's model, optimizer and step counter."""
    from tpu_utils import loop
    from training.learning import step

    config, model = trainer.config, trainer.model

    def make(metrics, outputs):
        train_step = step.make_train_step(model, trainer.optimizer, trainer.loss_fn,
                                          global_batch_size=config.global_batch_size, clip_global_norm=None,
                                          metrics=metrics, seed=config.seed)
        if not outputs:
            def replica_step(batch):
                train_step(batch)
                return {}
        else:
            replica_step = train_step
        return loop.make_train_loop(trainer.strategy, replica_step, trainer.global_step,
                                    model.non_trainable_variables, outputs=outputs)

    return {"template": trainer._train_loop, "no metrics": make([], ("loss",)),
            "no loss sum": make(trainer.train_metrics, ()), "bare": make([], ())}


def measure(model: str, batch: int, replicas: int, repetitions: int) -> dict:
    import tensorflow as tf

    from tpu_utils.strategy import make_strategy
    from training.trainer import Trainer

    config = _config(model, batch, replicas)
    trainer = Trainer(config, make_strategy(config.strategy, virtual_devices=config.virtual_devices))
    source = trainer.train_iterator()
    loops = variants(trainer)
    steps = tf.constant(STEPS, tf.int32)
    for run in loops.values():  # Trace and warm up.
        run(source, steps)
    samples = {name: [] for name in loops}
    for _ in range(repetitions):
        for name, run in loops.items():
            started = time.perf_counter()
            tf.nest.map_structure(lambda tensor: tensor.numpy(), run(source, steps))
            samples[name].append(STEPS * batch / (time.perf_counter() - started))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--batches", default="32,64")
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    from common.tf_logging import quiet_tensorflow  # Before TensorFlow loads: its C++ start-up lines off.

    quiet_tensorflow()
    from tpu_utils.strategy import configure_virtual_cpus

    replica_counts = [int(value) for value in args.replicas.split(",")]
    configure_virtual_cpus(max(replica_counts))
    load_before = os.getloadavg()[0]
    results = {f"{model} B={batch} R={replicas}": measure(model, int(batch), replicas, args.repetitions)
               for replicas in replica_counts for model in args.models.split(",") for batch in args.batches.split(",")}
    cases = list(results)
    print(f"examples/s, median of {args.repetitions}, {STEPS} steps per loop; load {load_before:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")
    print("| | " + " | ".join(cases) + " |\n" + "|---" * (len(cases) + 1) + "|")
    for name in results[cases[0]]:
        print(f"| {name} | " + " | ".join(f"{results[case][name] / 1000:.1f}k" for case in cases) + " |")
    print("| template / bare | " + " | ".join(f"{results[case]['template'] / results[case]['bare']:.2f}"
                                             for case in cases) + " |")


if __name__ == "__main__":
    main()
