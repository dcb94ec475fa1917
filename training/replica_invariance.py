"""Replica-invariance check: does a config train the same weights on 1 replica as on N?

    python -m training.replica_invariance --gin_file=configs/default.gin --replicas=1,2,4,8
    python -m training.replica_invariance --gin_file=configs/experiments/digits_mlp.gin --replicas=1,2,4 \
        --accumulate=1,2,4

Trains the config at each replica count (MirroredStrategy over virtual CPU devices) from the same initial weights on
the same global batches, in float64 (in float32 exact-math-equal runs part after one ReLU input rounds to the other
side of its kink), at the config's own optimizer and schedule, past the warm-up, and compares every weight (and EMA
average) with the first replica count: the worst max|a - b| / max(max|a|, 1% of the largest weight) must be <= 1e-9.
The probe turns on what the classic bugs need to show (an L2 regularizer, a binding gradient clip, synchronized
BatchNormalization); the header says what is true of the model built, and a FAIL names the layers that break
invariance (training/replica_hazards.py). `--accumulate` adds the ACCUMULATE_STEPS axis (models without
BatchNormalization). docs/correctness.md has the method and the measured figures.

Exit 0 if every run passes, 1 if not, 2 for a bad config. Run it after editing a model, a loss or the training step.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # TensorFlow loads in the functions that need it, after main() has set its log level.
    from training.config import ExperimentConfig
    from training.replica_hazards import ModelFacts
    from training.trainer import Trainer

TOLERANCE = 1e-9  # float64: exact-math-equal runs agree to ~1e-15; every bug above shows at 1e-4 or more.
FLOOR_FRACTION = 1e-2  # Differences are measured against at least this fraction of the model's largest weight.
MIN_STEPS = 40
PROBE_KERNEL_L2 = 1e-3
PROBE_CLIP_FRACTION = 0.5  # Clip at half the initial gradient norm: clipping binds in the first steps.
LIKELY_CAUSES = """Likely causes (the step, the loss, the model):
  - the loss is divided by the per-replica batch, not the global one (a mean in the loss function, or another
    denominator than global_batch_size in training/learning/step.py): the loss column shows the replica count's factor;
  - gradients summed across replicas twice (Keras' implicit all-reduce in apply_gradients left on beside the step's);
  - gradients clipped before the cross-replica sum (Keras' clipnorm/global_clipnorm, or clipping per replica);
  - a regularization loss not divided by the replica count (tf.nn.scale_regularization_loss);
  - with --accumulate: a micro-batch's loss divided by the micro-batch, not the global batch, or the regularization
    added once per micro-batch (the k column shows the factor); BatchNormalization (per-micro-batch statistics);
  - per-replica state: BatchNormalization that is not synchronized, a random layer keyed per replica (use
    models.layers.StatelessDropout), or other variables updated from one replica's batch.
The worst tensor says where the difference is largest, not always where it starts."""


@dataclasses.dataclass
class ReplicaRun:
    replicas: int
    loss: float
    weights: list  # (variable path, np.ndarray) per model weight, in model order, after the steps
    accumulate_steps: int = 1  # ACCUMULATE_STEPS of the run
    worst_difference: float = 0.0  # vs the reference run (0 for the reference itself)
    worst_tensor: str = ""
    loss_difference: float = 0.0


@dataclasses.dataclass
class Probe:
    """What the check ran: precision, steps and the settings it forced on."""

    precision: str
    steps: int
    kernel_l2: float | None = None  # Forced L2 (None: the model's own, or off)
    clip_global_norm: float | None = None
    model: ModelFacts | None = None  # What the built model has (training/replica_hazards.py)


def relative_difference(reference: np.ndarray, other: np.ndarray, floor: float = 0.0) -> float:
    """max|a - b| / max(max|a|, floor) (0 when both are empty or all zeros)."""
    if not reference.size:
        return 0.0
    scale = max(float(np.max(np.abs(reference))), floor)
    difference = float(np.max(np.abs(reference - other)))
    return difference / scale if scale else difference


def measure(config: ExperimentConfig, replica_counts: list[int], *, steps: int, precision: str = "float64",
            force_regularization: bool = True, force_clipping: bool = True,
            model_options: dict | None = None, bound_arguments=None,
            accumulate: list[int] | None = None) -> tuple[list[ReplicaRun], Probe]:
    """Trains `config` for `steps` steps at each replica count (and, with `accumulate`, at each ACCUMULATE_STEPS of
    it for each replica count); returns the runs (compared to the first) and the probe's settings.
    `bound_arguments`: as the Trainer takes it (the model arguments gin binds; None: nothing bound)."""
    from tpu_utils.strategy import configure_virtual_cpus
    from training import replica_hazards

    configure_virtual_cpus(max(replica_counts))
    accumulate = accumulate or [config.accumulate_steps]
    config = dataclasses.replace(config, accumulate_steps=accumulate[0], strategy="mirrored", precision=precision,
                                 steps_per_loop=steps, checkpoint_every=0, eval_every=0)
    options = {"synchronized_batch_norm": True, **(model_options or {})}
    probe = Probe(precision=precision, steps=steps)
    reference = _trainer(config, replica_counts[0], options, bound_arguments)
    if force_regularization and not reference.model.losses:
        probe.kernel_l2 = options["kernel_l2"] = PROBE_KERNEL_L2
        reference = _trainer(config, replica_counts[0], options, bound_arguments)
    probe.model = replica_hazards.inspect(reference.model)
    initial_weights = reference.model.get_weights()
    if force_clipping and config.clip_global_norm is None:
        probe.clip_global_norm = PROBE_CLIP_FRACTION * initial_gradient_norm(reference)
        config = dataclasses.replace(config, clip_global_norm=probe.clip_global_norm)
        reference = _trainer(config, replica_counts[0], options, bound_arguments)
    runs = []
    for replicas in replica_counts:
        for accumulate_steps in accumulate:
            first = replicas == replica_counts[0] and accumulate_steps == accumulate[0]
            trainer = reference if first else _trainer(
                dataclasses.replace(config, accumulate_steps=accumulate_steps), replicas, options, bound_arguments)
            trainer.model.set_weights(initial_weights)  # Identical start, whatever the initialisers did.
            metrics = trainer.train(trainer.train_iterator(), steps)
            weights = [(variable.path, variable.numpy()) for variable in trainer.model.weights]
            if trainer.ema is not None:  # EMA_DECAY: the averages must agree too (training/learning/ema.py).
                weights += [(f"ema/{variable.path}", average.numpy())
                            for variable, average in zip(trainer.trainable_variables, trainer.ema.averages,
                                                         strict=True)]
            runs.append(ReplicaRun(replicas=replicas, loss=metrics["loss"], weights=weights,
                                   accumulate_steps=accumulate_steps))
    compare(runs)
    return runs, probe


def _trainer(config: ExperimentConfig, replicas: int, model_options: dict, bound_arguments) -> Trainer:
    from tpu_utils.strategy import make_strategy
    from training.trainer import Trainer, nothing_bound

    return Trainer(dataclasses.replace(config, virtual_devices=replicas),
                   make_strategy("mirrored", virtual_devices=replicas), model_options=model_options,
                   bound_arguments=bound_arguments or nothing_bound)


def initial_gradient_norm(trainer: Trainer) -> float:
    """Global norm of the gradient at the trainer's current weights on its first global batch. Runs the model in
    training mode (BatchNormalization's moving statistics move): reset the weights afterwards."""
    import tensorflow as tf

    from tpu_utils.loop import run_on_next_batch
    from training.learning import step

    norm_step = step.make_gradient_norm_step(trainer.model, trainer.loss_fn,
                                                    global_batch_size=trainer.config.global_batch_size,
                                                    seed=trainer.config.seed, mixing=trainer.mixing)

    @tf.function
    def norm(source, step):
        return trainer.strategy.experimental_local_results(run_on_next_batch(trainer.strategy, norm_step, source,
                                                                             step))[0]

    return float(norm(trainer.train_iterator(), tf.constant(trainer.step, tf.int64)))


def compare(runs: list[ReplicaRun]) -> None:
    """Fills in each run's differences from the first run (see the module docstring for the measure)."""
    reference = runs[0]
    floor = FLOOR_FRACTION * max(float(np.max(np.abs(value))) for _, value in reference.weights if value.size)
    for run in runs[1:]:
        differences = {name: relative_difference(expected, actual, floor)
                       for (name, expected), (_, actual) in zip(reference.weights, run.weights, strict=True)}
        run.worst_tensor = max(differences, key=differences.get)
        run.worst_difference = differences[run.worst_tensor]
        run.loss_difference = abs(run.loss - reference.loss) / max(abs(reference.loss), 1e-30)


def report(runs: list[ReplicaRun], probe: Probe | None = None, tolerance: float = TOLERANCE) -> tuple[bool, str]:
    """(passed, a table of the runs); passed means every weight and the loss are within `tolerance`."""
    lines = []
    if probe is not None:
        forced = [f"kernel L2 {probe.kernel_l2:g}" if probe.kernel_l2 else "",
                  f"clip_global_norm {probe.clip_global_norm:.4g}" if probe.clip_global_norm else ""]
        forced = ", ".join(item for item in forced if item)
        model = f"; {probe.model.describe()}" if probe.model else ""
        lines.append(f"{probe.precision}, {probe.steps} steps{model}{'; forced on: ' + forced if forced else ''}")
    lines.append(f"{'replicas':>8}  {'k':>2}  {'loss':>12}  {'loss diff':>9}  {'worst weight diff':>17}  "
                 "worst tensor")
    for run in runs:
        lines.append(f"{run.replicas:>8}  {run.accumulate_steps:>2}  {run.loss:>12.8f}  {run.loss_difference:>9.2e}  "
                     f"{run.worst_difference:>17.2e}  {run.worst_tensor or '(reference)'}")
    passed = all(run.worst_difference <= tolerance and run.loss_difference <= tolerance for run in runs)
    several_k = len({run.accumulate_steps for run in runs}) > 1
    if passed:
        lines.append(f"PASS: every weight and the loss within {tolerance:g} of the {runs[0].replicas}-replica run"
                     f"{f' at k={runs[0].accumulate_steps}' if several_k else ''}.")
    else:
        lines.append(f"FAIL: weights or loss differ by more than {tolerance:g} across replica counts"
                     f"{' and ACCUMULATE_STEPS' if several_k else ''}.")
        findings = probe.model.findings if probe is not None and probe.model else []
        if findings:
            lines.append("The model has layers that break replica invariance (fix these first):")
            lines.extend(f"  - {finding}" for finding in findings)
        lines.append(LIKELY_CAUSES)
    return passed, "\n".join(lines)


def default_steps() -> int:
    """MIN_STEPS, or 10 past the end of the configured warm-up (of any schedule) if that is later."""
    from training.learning.schedules import warmup_steps_bound

    return max(MIN_STEPS, warmup_steps_bound() + 10)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.replica_invariance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gin_file", action="append", default=None)
    parser.add_argument("--gin_param", action="append", default=[])
    parser.add_argument("--replicas", default="1,2,4,8", help="comma-separated; the first is the reference")
    parser.add_argument("--accumulate", default=None,
                        help="comma-separated ACCUMULATE_STEPS to run at each replica count, e.g. 1,2,4 (models "
                             "without BatchNormalization); default: the config's")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"steps per replica count; default max({MIN_STEPS}, the schedule's warmup_steps + 10)")
    parser.add_argument("--force_regularization", action=argparse.BooleanOptionalAction, default=True,
                        help=f"add a kernel L2 of {PROBE_KERNEL_L2:g} if the model has no regularization loss")
    parser.add_argument("--force_clipping", action=argparse.BooleanOptionalAction, default=True,
                        help="clip at half the initial gradient norm if the config does not clip")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    args = parser.parse_args(argv[1:])
    logging.basicConfig(level=logging.WARNING)
    from common.tf_logging import quiet_tensorflow  # Before TensorFlow loads: its C++ start-up lines off.

    quiet_tensorflow()

    from common.errors import EXIT_CONFIG_ERROR, ConfigError, user_message
    from training import config_files, experiment  # The gin handling of train.py: configs read as training does.

    try:
        replica_counts = [int(count) for count in args.replicas.split(",")]
    except ValueError:
        replica_counts = []
    if not replica_counts or min(replica_counts) < 1:
        print(f"error: --replicas={args.replicas!r}: expected comma-separated integers >= 1, e.g. "
              "--replicas=1,2,4,8.", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    try:
        accumulate = [int(count) for count in args.accumulate.split(",")] if args.accumulate is not None else None
    except ValueError:
        accumulate = []
    if accumulate is not None and (not accumulate or min(accumulate) < 1):
        print(f"error: --accumulate={args.accumulate!r}: expected comma-separated integers >= 1, e.g. "
              "--accumulate=1,2,4.", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    try:
        config_files.parse(args.gin_file or [config_files.DEFAULT_GIN_FILE], args.gin_param,
                           search_path=config_files.REPO_ROOT)
        runs, probe = measure(experiment.experiment(), replica_counts, steps=args.steps or default_steps(),
                              force_regularization=args.force_regularization, force_clipping=args.force_clipping,
                              bound_arguments=experiment.bound_model_arguments, accumulate=accumulate)
    except (ConfigError, ValueError) as error:
        print(f"error: {user_message(error)}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    passed, table = report(runs, probe, args.tolerance)
    print(table)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
