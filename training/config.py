"""ExperimentConfig: every setting of one run, the root configurable of gin, checked before anything is built.

A plain dataclass (usable without gin in tests and tools); `training/experiment.py` exposes it to gin as
`experiment`, and configs/base.gin binds its fields to the macros (STRATEGY, MODEL, ...: docs/configuration.md,
"Macros"). Its fields are grouped in sections, and each section is checked by the module that uses it
(SETTINGS_CHECKS: each module's `check_settings`, with the messages of common/settings.py).
"""

import dataclasses

from data import builders, device_split, pipeline, service
from serving import tflite
from tasks.augmentation import by_name as augmentation
from tpu_utils import strategy
from training import batching, build_scope, controller, jit_compile, warm_start
from training.learning import accumulation, ema, metrics, optimizers
from training.observers import profiling, standard
from training.run_directory import checkpoints, history, storage_guard
from training.run_directory.storage_guard import DEFAULT_TIMEOUT_SECONDS

# In this order (the first wrong setting is the one reported; a check may use settings checked before it). A check
# returns the normalised values of its settings, if any (a gin list as a tuple).
SETTINGS_CHECKS = (controller.check_settings, pipeline.check_settings, accumulation.check_settings,
                   metrics.check_settings, standard.check_settings, augmentation.check_settings,
                   warm_start.check_settings, history.check_settings, profiling.check_settings,
                   strategy.check_settings, checkpoints.check_settings, storage_guard.check_settings,
                   build_scope.check_settings, builders.check_settings, batching.check_settings,
                   optimizers.check_settings, ema.check_settings, tflite.check_settings, device_split.check_settings,
                   service.check_settings, jit_compile.check_settings)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """One experiment. Step counts are optimizer steps; each step consumes one global batch."""

    # Hardware (tpu_utils/strategy.py, training/jit_compile.py).
    strategy: str = "auto"
    virtual_devices: int = 0
    tpu: str = "local"
    tpu_zone: str | None = None  # e.g. 'us-central1-b': gs:// buckets must be in its region (checked at start).
    target_replicas: int = 0  # Replicas the config is written for (TPU configs: 8 on a v3-8); 0 = not declared.
    startup_timeout_seconds: int = 300  # Waiting for the other workers of TF_CONFIG (or a TPU) before giving up.
    jit_compile: str = "off"  # 'off', 'on' or 'auto' (training/jit_compile.py: what the benchmark measured).
    # Data (data/, tasks/augmentation/by_name.py, training/batching.py).
    dataset: str
    data_dir: str | None = None
    global_batch_size: int
    seed: int = 0
    # Keep the train split on the devices and draw batches in the compiled loop (data/device_split.py): 'auto',
    # 'always', 'never'.
    train_data_on_device: str = "auto"
    # Batches made by tf.data services (data/service.py): '' = off, 'local', 'local:N', 'grpc://HOST:PORT[,...]'.
    data_service: str = ""
    # Training augmentations by name (tasks/augmentation/by_name.py); None = the dataset's own, [] = none.
    augmentation: tuple[str, ...] | None = None
    # Model (models/, training/warm_start.py, training/variable_selection.py).
    model: str
    # Warm start: another run's model_dir, a checkpoint prefix or a .weights.h5, used only while model_dir has no
    # checkpoint of its own; None = random initial weights.
    init_from: str | None = None
    # Variable-path patterns: which variables INIT_FROM loads (empty = all) ...
    init_include: tuple[str, ...] = ()
    init_exclude: tuple[str, ...] = ()
    # ... and which ones training updates (empty = all trainable ones); the others stay as loaded.
    trainable: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    # Optimization (training/learning/, training/build_scope.py).
    learning_rate: float
    optimizer: str = "sgd"
    lr_schedule: str = "constant"
    loss: str | None = None  # Per-example loss by name (training/learning/losses.py); None = the task's default.
    clip_global_norm: float | None = None  # Clip the replica-summed gradients to this global norm; None = off.
    # Micro-batches per optimizer step (training/learning/accumulation.py): each of GLOBAL_BATCH_SIZE / k examples.
    accumulate_steps: int = 1
    # EMA of the trained weights (training/learning/ema.py), evaluated and exported; in [0, 1); None or 0 = off.
    ema_decay: float | None = None
    precision: str = "float32"
    # The host loop (training/controller.py).
    train_steps: int
    steps_per_loop: int
    checkpoint_every: int  # Steps between checkpoints; a multiple of steps_per_loop; 0 = only at the end.
    eval_every: int  # Steps between evaluations; a multiple of steps_per_loop; 0 = only at the end.
    # Evaluation (training/learning/metrics.py, training/run_directory/history.py, training/observers/standard.py).
    metrics: tuple[str, ...] | None = None  # Metric names; None = the task's defaults.
    eval_batch_size: int | None = None  # Global eval batch; None = global_batch_size.
    best_metric: str | None = None  # e.g. 'eval/accuracy': keep and export the best checkpoint by it; None = off.
    best_mode: str = "auto"  # 'max', 'min', or 'auto' (min for losses and errors).
    # Stop after this many evaluations in a row without BEST_METRIC improving by more than early_stop_min_delta;
    # 0 = off (training/observers/standard.py EarlyStopping).
    early_stop_patience: int = 0
    early_stop_min_delta: float = 0.0
    # The run directory and what watches it (training/run_directory/, training/observers/, serving/tflite.py).
    checkpoints_to_keep: int = 3
    # How long a run waits for failing storage (retrying, with a line per retry) before it stops with exit 6.
    storage_timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    profile_steps: tuple[int, int] | None = None  # (start, stop): a profiler trace of those steps; None = off.
    profiler_port: int = 0  # A profiler server on this port for on-demand captures (chief only); 0 = off.
    # Observers (training/observers/standard.py OBSERVERS) called after the standard ones, e.g. your own logger.
    observers: tuple[str, ...] = ()
    # Also write model.tflite (LiteRT) into every export, when the serving graph converts (docs/serving.md).
    export_tflite: bool = False
    # With export_tflite: model.tflite's input size (H, W) for an export taking images of any size (serving/tflite.py).
    export_tflite_image_size: tuple[int, int] | None = None

    def __post_init__(self):
        for check in SETTINGS_CHECKS:
            for name, value in (check(self) or {}).items():
                object.__setattr__(self, name, value)
