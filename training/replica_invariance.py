"""Replica-invariance check: does a config train the same weights on 1 replica as on N?

    python -m training.replica_invariance --gin_file=configs/default.gin --replicas=1,2,4,8

Trains the config for a few steps at each replica count (MirroredStrategy over virtual CPU devices, the same global
batch, the same initial weights, float32, dropout off, BatchNormalization synchronized) and compares every model
weight with the first (reference) replica count: max|a - b| / max|a| per tensor, the worst tensor is the figure
(shared/notes/contract.md). Above the tolerance (1e-5) it exits 1: a loss divided by the per-replica batch,
gradients summed twice or clipped per replica all show up here as a factor of the replica count.
Run it after editing a model, a loss or the training step.
"""

import argparse
import dataclasses
import logging
import sys

import numpy as np

from tpu_utils.strategy import configure_virtual_cpus, make_strategy
from training.config import ExperimentConfig
from training.trainer import Trainer

TOLERANCE = 1e-5
# What the check turns off: per-replica batch statistics and dropout masks differ by replica count by design.
CHECK_MODEL_OPTIONS = {"dropout_rate": 0.0, "synchronized_batch_norm": True}


@dataclasses.dataclass
class ReplicaRun:
    replicas: int
    loss: float
    weights: list  # (layer-independent name, np.ndarray) per model weight, in model order, after the steps
    worst_difference: float = 0.0  # vs the reference run (0 for the reference itself)
    worst_tensor: str = ""
    loss_difference: float = 0.0


def relative_difference(reference: np.ndarray, other: np.ndarray) -> float:
    """max|a - b| / max|a| (0 when both are all zeros)."""
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    difference = float(np.max(np.abs(reference - other))) if reference.size else 0.0
    return difference / scale if scale else difference


def measure(config: ExperimentConfig, replica_counts: list[int], *, steps: int) -> list[ReplicaRun]:
    """Trains `config` for `steps` steps at each replica count; returns the runs, compared to the first."""
    configure_virtual_cpus(max(replica_counts))
    config = dataclasses.replace(config, strategy="mirrored", precision="float32", steps_per_loop=steps,
                                 checkpoint_every=0, eval_every=0)
    runs, initial_weights = [], None
    for replicas in replica_counts:
        trainer = Trainer(dataclasses.replace(config, virtual_devices=replicas),
                          make_strategy("mirrored", virtual_devices=replicas), model_options=CHECK_MODEL_OPTIONS)
        if initial_weights is None:
            initial_weights = trainer.model.get_weights()
        trainer.model.set_weights(initial_weights)  # Identical start, whatever the initialisers did.
        metrics = trainer.train(trainer.train_iterator(), steps)
        weights = [(variable.path, variable.numpy()) for variable in trainer.model.weights]
        runs.append(ReplicaRun(replicas=replicas, loss=metrics["loss"], weights=weights))
    reference = runs[0]
    for run in runs[1:]:
        differences = {name: relative_difference(expected, actual)
                       for (name, expected), (_, actual) in zip(reference.weights, run.weights, strict=True)}
        run.worst_tensor = max(differences, key=differences.get)
        run.worst_difference = differences[run.worst_tensor]
        run.loss_difference = abs(run.loss - reference.loss) / max(abs(reference.loss), 1e-12)
    return runs


def report(runs: list[ReplicaRun], tolerance: float = TOLERANCE) -> tuple[bool, str]:
    """(passed, a table of the runs); passed means every weight and the loss are within `tolerance`."""
    lines = [f"{'replicas':>8}  {'loss':>10}  {'loss diff':>9}  {'worst weight diff':>17}  worst tensor"]
    for run in runs:
        lines.append(f"{run.replicas:>8}  {run.loss:>10.6f}  {run.loss_difference:>9.2e}  "
                     f"{run.worst_difference:>17.2e}  {run.worst_tensor or '(reference)'}")
    passed = all(run.worst_difference <= tolerance and run.loss_difference <= tolerance for run in runs)
    if passed:
        lines.append(f"PASS: every weight within {tolerance:g} of the {runs[0].replicas}-replica run.")
    else:
        lines.append(f"FAIL: weights differ by more than {tolerance:g} across replica counts. A ratio near the replica "
                     "count means the loss is divided by the per-replica batch (divide by the global batch: "
                     "training/step.py), gradients are summed twice, or clipped before the cross-replica sum.")
    return passed, "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gin_file", action="append", default=None)
    parser.add_argument("--gin_param", action="append", default=[])
    parser.add_argument("--replicas", default="1,2,4,8", help="comma-separated; the first is the reference")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--optimizer", default="sgd", help="optimizer for the check (SGD shows a factor of R plainly)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    args = parser.parse_args(argv[1:])
    logging.basicConfig(level=logging.WARNING)

    import train  # The entry point's gin handling, so the check reads configs exactly as training does.
    from training import config_files, experiment
    from training.errors import ConfigError

    try:
        replica_counts = [int(count) for count in args.replicas.split(",")]
        config_files.parse(args.gin_file or [train.DEFAULT_GIN_FILE], args.gin_param, search_path=train.REPO_ROOT)
        config = dataclasses.replace(experiment.experiment(), optimizer=args.optimizer)
        runs = measure(config, replica_counts, steps=args.steps)
    except (ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    passed, table = report(runs, args.tolerance)
    print(table)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
