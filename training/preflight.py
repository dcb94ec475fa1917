"""`train.py --preflight`: checks a config on this CPU machine before anyone pays for a TPU; exit 0 or 5.

For the config's declared replica count (`experiment.target_replicas`; TPU configs declare it) it builds the real
input pipelines and model at one replica's share of the batch (what each TPU core runs: nothing in the checks
needs the other replicas, and a pod's 32 mirrored copies of the model would only cost memory and minutes), then
checks:
- the global batches divide by the replica count (every replica runs one static shape);
- every per-replica input shape is fully static (TPUs compile one program per shape; CPUs and GPUs would silently
  recompile instead);
- on a pod slice (TPU set to a name), DATA_DIR and model_dir are on gs:// (the input pipeline runs on every host's
  CPU and checkpoints are written by the TPU hosts: local paths exist on worker 0 only);
- gs:// buckets exist, are writable and in the TPU's region (gcs/bucket_checks.py);
- the train step of one replica compiles with XLA (compile only, nothing runs): strings, py_function and other ops
  a TPU cannot run fail here instead of on the TPU; so does the task's per-example augmentation, if any
  (experiment.augmentation: it runs in the host's input pipeline on a TPU, but on the device where the split is kept
  there, data/device_split.py);
- where the train split is kept on the device (data/device_split.py; 'auto' keeps it on a TPU when it fits beside
  the model), the draw of a batch compiles with XLA; the line says how many bytes each replica keeps, or why the
  host's tf.data pipeline reads the batches instead.
It prints one line per check and every problem found, not just the first.
"""

import dataclasses
import logging
import time
from collections.abc import Callable, Collection

import tensorflow as tf

from common.errors import ConfigError
from common.extras import check_gcs_paths
from data import builders, pipeline
from training import jit_compile
from training.batching import batching_for
from training.config import ExperimentConfig
from training.trainer import Trainer, nothing_bound

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Check:
    name: str
    problem: str | None = None  # None: passed.
    note: str = ""


def preflight_replicas(config: ExperimentConfig) -> int:
    """The replica count the config is meant for: target_replicas, else VIRTUAL_DEVICES, else 1."""
    return config.target_replicas or config.virtual_devices or 1


def run_preflight(config: ExperimentConfig, model_dir: str, *,
                  bound_arguments: Callable[[str], Collection[str]] = nothing_bound) -> list[Check]:
    """Runs every check (see the module docstring); returns them, failed ones with their problem."""
    replicas = preflight_replicas(config)
    checks = [_check_divisibility(config, replicas), _check_storage(config, model_dir),
              _check_buckets(config, model_dir)]
    if checks[0].problem or checks[2].problem:
        return checks  # Nothing can be built for this replica count, or the data's bucket is not usable.
    batching = batching_for(config, replicas)
    # One replica's share on this process's device: its per-replica input shapes and train step are the ones each
    # replica of the config runs.
    one_replica = dataclasses.replace(config, global_batch_size=batching.per_replica,
                                      eval_batch_size=batching.eval_per_replica, virtual_devices=0)
    try:
        trainer = Trainer(one_replica, tf.distribute.get_strategy(), bound_arguments=bound_arguments)
        if not pipeline.reads_by_shard(trainer.dataset_spec, trainer.builder):  # The global batch, not the share.
            pipeline.check_batch_fits(trainer.dataset_spec, builders.split_size(
                trainer.builder, trainer.dataset_spec.train_split), config.global_batch_size)
        # experiment.jit_compile='on' as the config's own replicas and strategy would resolve it (a ConfigError
        # where it cannot compile there).
        jit_compile.resolve(config, trainer.model, replicas=replicas, on_tpu=trainer.on_tpu,
                            mirrored=replicas > 1 or config.strategy in ("mirrored", "multi_worker_mirrored"),
                            per_replica_batch=batching.per_replica)
        one_pipeline = tf.distribute.InputContext()
        # Where the split is kept on the device, its draw is what the step receives (and the host's pipeline, never
        # used then, would decode the whole split a second time).
        train_spec = (_drawn_spec(trainer.train_iterator()) if trainer.train_data_on_device else
                      trainer.train_input_fn()(one_pipeline).element_spec)
        eval_spec = trainer.eval_input_fn(one_pipeline).element_spec
    except ConfigError as error:
        return checks + [Check("input pipelines and model build", str(error))]
    checks.append(Check("input pipelines and model build", note=f"{trainer.model.count_params():,} parameters"))
    checks.append(_check_static_shapes({"train": train_spec, "eval": eval_spec}))
    checks.append(_check_xla_compiles(trainer, train_spec))
    checks.append(_check_train_split(trainer))
    if getattr(trainer.task, "augment", None) is not None:
        # The draw on the device augments its batch: compiled there already (a second compile took ~20 s).
        drawn = trainer.train_data_on_device and not checks[-1].problem
        checks.append(Check("augmentation compiles with XLA", note="in the draw above") if drawn else
                      _check_augmentation_compiles(trainer.task))
    return checks


def report(checks: list[Check], config: ExperimentConfig) -> str:
    lines = [f"preflight for {preflight_replicas(config)} replica(s), STRATEGY={config.strategy!r}, "
             f"TPU={config.tpu!r}, PRECISION={config.precision!r}:"]
    for check in checks:
        status = "FAIL" if check.problem else "ok  "
        lines.append(f"  {status} {check.name}" + (f": {check.problem}" if check.problem else
                                                    (f" ({check.note})" if check.note else "")))
    failed = sum(1 for check in checks if check.problem)
    lines.append(f"preflight {'failed: ' + str(failed) + ' problem(s)' if failed else 'passed'}.")
    return "\n".join(lines)


def _check_divisibility(config: ExperimentConfig, replicas: int) -> Check:
    try:
        per_replica = batching_for(config, replicas).per_replica
    except ConfigError as error:
        return Check("batch divides by the replicas", str(error))
    note = f"{per_replica} examples per replica"
    if config.strategy == "tpu" and per_replica % 8:
        note += "; TPUs want a multiple of 8 per replica (ideally 128)"
    return Check("batch divides by the replicas", note=note)


def _check_storage(config: ExperimentConfig, model_dir: str) -> Check:
    if config.strategy != "tpu" or config.tpu == "local":
        return Check("storage", note="local paths allowed (not a pod slice)")
    local = [f"{name}={value!r}" for name, value in (("DATA_DIR", config.data_dir), ("model_dir", model_dir))
             if not str(value or "").startswith("gs://")]
    if local:
        return Check("storage on gs://", f"{', '.join(local)} is not on gs://: on a pod slice every host reads the "
                     "data and the TPU hosts write checkpoints, so both must be gs:// paths (stage the data with "
                     "`python -m stage --dataset=NAME --data_dir=gs://BUCKET/tensorflow_datasets`; pass "
                     "--model_dir=gs://...).")
    return Check("storage on gs://")


def _check_buckets(config: ExperimentConfig, model_dir: str) -> Check:
    paths = {"DATA_DIR": config.data_dir, "model_dir": model_dir}
    if not any(str(path or "").startswith("gs://") for path in paths.values()):
        return Check("gs:// buckets", note="none used")
    try:
        check_gcs_paths(paths, tpu_zone=config.tpu_zone)
    except ConfigError as error:
        return Check("gs:// buckets exist and are writable", str(error))
    return Check("gs:// buckets exist and are writable")


def _drawn_spec(split) -> tuple:
    """The TensorSpecs of one replica's batch drawn from a DeviceSplit (traced, not run)."""
    drawn = tf.function(split.replica_batch).get_concrete_function(tf.TensorSpec([], tf.int64)).structured_outputs
    return tf.nest.map_structure(lambda tensor: tf.TensorSpec(tensor.shape, tensor.dtype), drawn)


def _check_static_shapes(specs: dict) -> Check:
    dynamic = [f"{name} {spec}" for name, element in specs.items() for spec in tf.nest.flatten(element)
               if not spec.shape.is_fully_defined()]
    if dynamic:
        return Check("static per-replica input shapes", "not fully defined: " + "; ".join(dynamic) + ". TPUs need "
                     "static shapes: batch with drop_remainder=True and give images a fixed size.")
    shapes = ", ".join(str(spec.shape) for spec in tf.nest.flatten(specs["train"]))
    return Check("static per-replica input shapes", note=f"train {shapes}")


def _check_xla_compiles(trainer: Trainer, train_spec) -> Check:
    """Compiles (does not run) one replica's train step with XLA, at the per-replica batch."""
    compiled = tf.function(trainer.train_step, jit_compile=True)
    started = time.perf_counter()
    try:
        batch = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), train_spec)  # Shapes only.
        compiled.experimental_get_compiler_ir(batch)(stage="hlo")
    except Exception as error:  # noqa: BLE001 - XLA reports unsupported ops in several error types.
        message = " ".join(str(error).split())
        return Check("train step compiles with XLA", f"{message[:600]} -- TPUs run only XLA-compilable ops: "
                     "remove string ops, tf.py_function and data-dependent shapes from the model and loss.")
    return Check("train step compiles with XLA", note=f"one replica, {time.perf_counter() - started:.1f} s")


def _check_train_split(trainer: Trainer) -> Check:
    """Where the batches come from; on the device, the draw of one replica's batch compiles with XLA (compile only)."""
    if not trainer.train_data_on_device:
        return Check("train split", note=f"read by tf.data on the host: {trainer.host_input_reason}")
    name = "train split on the device, its draw compiles with XLA"
    split = trainer.train_iterator()
    try:
        tf.function(split.replica_batch, jit_compile=True).experimental_get_compiler_ir(
            tf.constant(0, tf.int64))(stage="hlo")
    except Exception as error:  # noqa: BLE001 - as in _check_xla_compiles.
        return Check(name, " ".join(str(error).split())[:600])
    return Check(name, note=f"{split.bytes_per_replica / 2**20:,.1f} MiB per replica")


def _check_augmentation_compiles(task) -> Check:
    """Compiles (does not run) the task's per-example augmentation of one image with XLA."""
    compiled = tf.function(task.augment, jit_compile=True)
    try:
        compiled.experimental_get_compiler_ir(tf.zeros(task.input_shape), tf.zeros([2], tf.int64))(stage="hlo")
    except Exception as error:  # noqa: BLE001 - as in _check_xla_compiles.
        return Check("augmentation compiles with XLA", " ".join(str(error).split())[:600])
    return Check("augmentation compiles with XLA")
