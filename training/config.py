"""ExperimentConfig: every setting of one run, validated before anything is built.

A plain dataclass (usable without gin in tests and tools); `training/experiment.py` exposes it to gin as the root
configurable `experiment`, and configs/base.gin binds its fields to the macros (STRATEGY, MODEL, ...:
docs/configuration.md, "Macros").
"""

import dataclasses
import math

from common.errors import ConfigError
from common.registry import meant_name
from training.run_directory.storage_guard import DEFAULT_TIMEOUT_SECONDS
from training.variable_selection import check_patterns

# The fields configs/base.gin binds to a macro of the same name in upper case (docs/configuration.md, "Macros"): an
# error names them as the macro (MODEL=...). Every other field is set as experiment.<field> (tests/test_configs.py
# checks this set against base.gin).
MACRO_FIELDS = frozenset({"strategy", "virtual_devices", "tpu", "model", "dataset", "data_dir", "global_batch_size",
                          "train_steps", "steps_per_loop", "accumulate_steps", "ema_decay", "checkpoint_every",
                          "eval_every", "learning_rate", "precision", "seed", "best_metric", "best_mode",
                          "early_stop_patience", "profile_steps", "profiler_port", "init_from"})
# A sensible value per integer field without a default, for the "e.g." of an error.
_INT_EXAMPLES = {"global_batch_size": 128, "train_steps": 1000, "steps_per_loop": 100, "checkpoint_every": 1000,
                 "eval_every": 1000, "eval_batch_size": 128, "profiler_port": 6009}

# Step settings are at most 2**31 - 1: the on-device loop counts a loop's steps, and evaluation its batches, in int32
# (training/trainer.py, tpu_utils/loop.py); a larger count overflows into negative steps.
MAX_STEPS = 2 ** 31 - 1
# The training stream's positions (step * GLOBAL_BATCH_SIZE + index, int64) end at 2**62 (data/pipeline.py).
MAX_EXAMPLES = 2 ** 62
# keras.utils.set_random_seed seeds NumPy's legacy generator with SEED, which takes 0 .. 2**32 - 1 only.
MAX_SEED = 2 ** 32 - 1
MAX_PORT = 65535

# float64: the replica-invariance check's precision (exact math to ~1e-15); on CPUs only, slow elsewhere.
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16", "float64")
# Where training batches are drawn (data/device_split.py): on the devices when it helps, always, or by tf.data.
TRAIN_DATA_ON_DEVICE = ("auto", "always", "never")
# XLA for the per-replica forward and backward pass on CPUs/GPUs (training/jit_compile.py); TPUs always compile.
JIT_COMPILE = ("off", "on", "auto")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """One experiment. Step counts are optimizer steps; each step consumes one global batch."""

    strategy: str = "auto"
    virtual_devices: int = 0
    tpu: str = "local"
    model: str
    dataset: str
    data_dir: str | None = None
    global_batch_size: int
    train_steps: int
    steps_per_loop: int
    # Micro-batches per optimizer step (training/learning/accumulation.py): each of GLOBAL_BATCH_SIZE / k examples.
    accumulate_steps: int = 1
    # EMA of the trained weights (training/learning/ema.py), evaluated and exported; in [0, 1); None or 0 = off.
    ema_decay: float | None = None
    checkpoint_every: int  # Steps between checkpoints; a multiple of steps_per_loop; 0 = only at the end.
    eval_every: int  # Steps between evaluations; a multiple of steps_per_loop; 0 = only at the end.
    learning_rate: float
    precision: str = "float32"
    seed: int = 0
    optimizer: str = "sgd"
    lr_schedule: str = "constant"
    loss: str | None = None  # Per-example loss by name (training/learning/losses.py); None = the task's default.
    metrics: tuple[str, ...] | None = None  # Metric names (training/learning/metrics.py); None = the task's defaults.
    clip_global_norm: float | None = None  # Clip the replica-summed gradients to this global norm; None = off.
    eval_batch_size: int | None = None  # Global eval batch; None = global_batch_size.
    checkpoints_to_keep: int = 3
    tpu_zone: str | None = None  # e.g. 'us-central1-b': gs:// buckets must be in its region (checked at start).
    target_replicas: int = 0  # Replicas the config is written for (TPU configs: 8 on a v3-8); 0 = not declared.
    startup_timeout_seconds: int = 300  # Waiting for the other workers of TF_CONFIG (or a TPU) before giving up.
    # How long a run waits for failing storage (retrying, with a line per retry) before it stops with exit 6.
    storage_timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    best_metric: str | None = None  # e.g. 'eval/accuracy': keep and export the best checkpoint by it; None = off.
    best_mode: str = "auto"  # 'max', 'min', or 'auto' (min for losses and errors).
    # Stop after this many evaluations in a row without BEST_METRIC improving by more than early_stop_min_delta;
    # 0 = off (training/observers/standard.py EarlyStopping).
    early_stop_patience: int = 0
    early_stop_min_delta: float = 0.0
    profile_steps: tuple[int, int] | None = None  # (start, stop): a profiler trace of those steps; None = off.
    profiler_port: int = 0  # A profiler server on this port for on-demand captures (chief only); 0 = off.
    # Keep the train split on the devices and draw batches in the compiled loop (data/device_split.py): 'auto',
    # 'always', 'never'.
    train_data_on_device: str = "auto"
    jit_compile: str = "off"  # 'off', 'on' or 'auto' (training/jit_compile.py: what the benchmark measured).
    # Also write model.tflite (LiteRT) into every export, when the serving graph converts (docs/serving.md).
    export_tflite: bool = False
    # With export_tflite: model.tflite's input size (H, W) for an export taking images of any size (serving/tflite.py).
    export_tflite_image_size: tuple[int, int] | None = None
    # Observers (training/observers/standard.py OBSERVERS) called after the standard ones, e.g. your own logger.
    observers: tuple[str, ...] = ()
    # Warm start (training/warm_start.py): another run's model_dir, a checkpoint prefix or a .weights.h5, used only
    # while model_dir has no checkpoint of its own; None = random initial weights.
    init_from: str | None = None
    # Variable-path patterns (training/variable_selection.py): which variables INIT_FROM loads (empty = all) ...
    init_include: tuple[str, ...] = ()
    init_exclude: tuple[str, ...] = ()
    # ... and which ones training updates (empty = all trainable ones); the others stay as loaded.
    trainable: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    # Training augmentations by name (training/augmentation.py); None = the dataset's own, [] = none.
    augmentation: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.metrics is not None:  # A gin list: kept as a tuple, so the config stays hashable and frozen.
            if isinstance(self.metrics, str) or not all(isinstance(name, str) for name in self.metrics):
                raise ConfigError(f"experiment.metrics={self.metrics!r} must be a list of metric names, e.g. "
                                  "--gin_param=\"experiment.metrics=['accuracy', 'top_5_accuracy']\".")
            object.__setattr__(self, "metrics", tuple(self.metrics))
        if isinstance(self.observers, str) or not all(isinstance(name, str) for name in self.observers):
            raise ConfigError(f"experiment.observers={self.observers!r} must be a list of observer names, e.g. "
                              "--gin_param=\"experiment.observers=['my_logger']\".")
        object.__setattr__(self, "observers", tuple(self.observers))
        if isinstance(self.augmentation, list):  # Checked by name in training/augmentation.py.
            object.__setattr__(self, "augmentation", tuple(self.augmentation))
        self._check_warm_start()
        # Checked here, before the strategy is made (minutes on a TPU), not when the controller first needs them.
        if self.best_mode not in ("max", "min", "auto"):
            raise ConfigError(f"BEST_MODE={self.best_mode!r} must be 'max', 'min' or 'auto'; e.g. "
                              f"{how_to_set('best_mode', 'max')}.")
        if self.best_metric is not None and not (isinstance(self.best_metric, str)
                                                 and self.best_metric.startswith("eval/") and self.best_metric[5:]):
            raise ConfigError(f"BEST_METRIC={self.best_metric!r} must name an evaluation metric, e.g. "
                              f"{how_to_set('best_metric', 'eval/accuracy')} or 'eval/loss'.")
        object.__setattr__(self, "profile_steps", check_profile_steps(self.profile_steps))
        for name in ("global_batch_size", "checkpoints_to_keep", "startup_timeout_seconds", "storage_timeout_seconds"):
            _require_int(name, getattr(self, name), minimum=1)
        for name in ("virtual_devices", "target_replicas"):
            _require_int(name, getattr(self, name), minimum=0)
        for name, minimum in (("train_steps", 1), ("steps_per_loop", 1), ("checkpoint_every", 0), ("eval_every", 0)):
            _require_int(name, getattr(self, name), minimum=minimum, maximum=MAX_STEPS,
                         why="2**31 - 1: step counts are int32 on the device")
        _require_int("accumulate_steps", self.accumulate_steps, minimum=1, maximum=MAX_STEPS,
                     why="2**31 - 1: the micro-batch loop counts in int32 on the device")
        _require_int("early_stop_patience", self.early_stop_patience, minimum=0)
        if self.early_stop_patience:
            if not self.best_metric:
                raise ConfigError(f"EARLY_STOP_PATIENCE={self.early_stop_patience} needs BEST_METRIC, the metric that "
                                  f"must improve; e.g. {how_to_set('best_metric', 'eval/accuracy')}.")
            if not self.eval_every:
                raise ConfigError(f"EARLY_STOP_PATIENCE={self.early_stop_patience} needs evaluations during training: "
                                  f"set EVAL_EVERY, e.g. {how_to_set('eval_every', self.steps_per_loop * 5)}.")
        if not isinstance(self.early_stop_min_delta, (int, float)) or isinstance(self.early_stop_min_delta, bool) \
                or not 0 <= self.early_stop_min_delta < math.inf:
            raise ConfigError(f"experiment.early_stop_min_delta={self.early_stop_min_delta!r} must be a number >= 0; "
                              f"e.g. {how_to_set('early_stop_min_delta', 0.001)}.")
        _require_int("seed", self.seed, minimum=0, maximum=MAX_SEED, why="2**32 - 1: NumPy's seed range")
        _require_int("profiler_port", self.profiler_port, minimum=0, maximum=MAX_PORT,
                     why="the largest TCP port; 0 = off")
        if self.accumulate_steps > self.global_batch_size:  # Suggest a divisor, not a GLOBAL_BATCH_SIZE of k.
            divisor = next((k for k in range(2, self.global_batch_size + 1) if self.global_batch_size % k == 0), 1)
            raise ConfigError(f"ACCUMULATE_STEPS={self.accumulate_steps} is more than GLOBAL_BATCH_SIZE="
                              f"{self.global_batch_size}, the examples of one step: each of its micro-batches needs at "
                              f"least one. Use a divisor of {self.global_batch_size} (each micro-batch holds "
                              f"GLOBAL_BATCH_SIZE / ACCUMULATE_STEPS examples), e.g. "
                              f"{how_to_set('accumulate_steps', divisor)}.")
        if self.global_batch_size % self.accumulate_steps:
            nearest = _nearest_multiple(self.global_batch_size, self.accumulate_steps)
            raise ConfigError(f"GLOBAL_BATCH_SIZE={self.global_batch_size} does not divide by ACCUMULATE_STEPS="
                              f"{self.accumulate_steps}: every micro-batch must have the same size. Use a multiple of "
                              f"{self.accumulate_steps}, e.g. {how_to_set('global_batch_size', nearest)}, or another "
                              "ACCUMULATE_STEPS.")
        if self.train_steps * self.global_batch_size > MAX_EXAMPLES:
            raise ConfigError(f"TRAIN_STEPS={self.train_steps} x GLOBAL_BATCH_SIZE={self.global_batch_size} examples "
                              "is more than the training stream's 2**62 positions; use fewer steps, e.g. "
                              f"{how_to_set('train_steps', MAX_EXAMPLES // self.global_batch_size)}.")
        if self.data_dir is not None and not isinstance(self.data_dir, str):
            raise ConfigError(f"DATA_DIR={self.data_dir!r} must be a directory (a string) or None for TFDS's default; "
                              f"e.g. {how_to_set('data_dir', '/data/tensorflow_datasets')}.")
        if self.data_dir is not None and not self.data_dir.strip():
            raise ConfigError(f"DATA_DIR={self.data_dir!r} is empty (an unset variable in a script?): TFDS would "
                              "build the data in the current directory. Set a directory, e.g. "
                              f"{how_to_set('data_dir', '/data/tensorflow_datasets')}, or None for TFDS's default.")
        if self.eval_batch_size is not None:
            _require_int("eval_batch_size", self.eval_batch_size, minimum=1)
        for name in ("checkpoint_every", "eval_every"):
            value = getattr(self, name)
            if value % self.steps_per_loop:
                nearest = max(1, round(value / self.steps_per_loop)) * self.steps_per_loop
                raise ConfigError(f"{setting(name)}={value} must be a multiple of STEPS_PER_LOOP={self.steps_per_loop} "
                                  f"(the host only acts between loops); e.g. {how_to_set(name, nearest)}.")
        if not isinstance(self.learning_rate, (int, float)) or isinstance(self.learning_rate, bool) or \
                not 0 < self.learning_rate < math.inf:
            raise ConfigError(f"LEARNING_RATE={self.learning_rate!r} must be a finite number > 0; e.g. "
                              f"{how_to_set('learning_rate', 0.01)}.")
        if self.clip_global_norm is not None and not self.clip_global_norm > 0:
            raise ConfigError(f"experiment.clip_global_norm={self.clip_global_norm!r} must be > 0, or None to disable "
                              f"clipping; e.g. {how_to_set('clip_global_norm', 1.0)}.")
        if self.ema_decay is not None and (not isinstance(self.ema_decay, (int, float))
                                           or isinstance(self.ema_decay, bool) or not 0 <= self.ema_decay < 1):
            raise ConfigError(f"EMA_DECAY={self.ema_decay!r} must be a number in [0, 1) (the weight of the old "
                              f"average per step), or None or 0 for off; e.g. {how_to_set('ema_decay', 0.999)}.")
        if not self.ema_decay:  # 0 is off, like None: one value for "off" downstream.
            object.__setattr__(self, "ema_decay", None)
        if not isinstance(self.export_tflite, bool):
            raise ConfigError(f"experiment.export_tflite={self.export_tflite!r} must be True or False; e.g. "
                              f"{how_to_set('export_tflite', True)}.")
        from serving.tflite import check_image_size  # Imports TensorFlow: here, not when this module loads.
        object.__setattr__(self, "export_tflite_image_size", check_image_size(
            self.export_tflite_image_size, how_to_set("export_tflite_image_size", (224, 224))))
        for name, choices in (("train_data_on_device", TRAIN_DATA_ON_DEVICE), ("precision", PRECISIONS),
                              ("jit_compile", JIT_COMPILE)):
            if getattr(self, name) not in choices:  # True for 'on', 'Float32', 'autp': the one meant, if any.
                meant = meant_name(getattr(self, name), choices)
                raise ConfigError(f"{setting(name)}={getattr(self, name)!r} is not one of "
                                  f"{', '.join(map(repr, choices))}; {'did you mean' if meant else 'e.g.'} "
                                  f"{how_to_set(name, meant or choices[0])}{'?' if meant else '.'}")

    def _check_warm_start(self) -> None:
        """INIT_FROM and the variable patterns: strings, patterns only with a source to load (before any build)."""
        for name in ("init_include", "init_exclude", "trainable", "frozen"):
            object.__setattr__(self, name, check_patterns(f"experiment.{name}", getattr(self, name)))
        if self.init_from is not None and (not isinstance(self.init_from, str) or not self.init_from.strip()):
            raise ConfigError(f"INIT_FROM={self.init_from!r} must be a path (a run's model_dir, a checkpoint prefix "
                              "or a .weights.h5 file, local or gs://) or None; e.g. "
                              f"{how_to_set('init_from', 'runs/pretrain')}.")
        if isinstance(self.init_from, str) and self.init_from.endswith(".keras"):
            raise ConfigError(f"INIT_FROM={self.init_from!r}: a .keras model file is not read; save its weights "
                              "(keras.saving.load_model(path).save_weights('model.weights.h5')) and give that file.")
        if self.init_from is None and (self.init_include or self.init_exclude):
            raise ConfigError("experiment.init_include/init_exclude are set but INIT_FROM is None: set INIT_FROM, e.g. "
                              f"{how_to_set('init_from', 'runs/pretrain')}, or drop them.")

    def eval_batch_for(self, num_replicas: int) -> int:
        """The global eval batch on `num_replicas` replicas: eval_batch_size if set, else GLOBAL_BATCH_SIZE rounded
        down to a multiple of the replicas (evaluation pads and masks, so its batch never changes the result)."""
        if self.eval_batch_size:
            return self.eval_batch_size
        return max(num_replicas, self.global_batch_size // num_replicas * num_replicas)

    def check_replicas(self, num_replicas: int, *, training: bool = True) -> None:
        """Batches must split evenly over replicas: every replica runs the same static shape. Evaluating alone
        (`training=False`) needs only the eval batch to split."""
        batches = [("experiment.eval_batch_size", self.eval_batch_for(num_replicas))]
        if training:
            batches.insert(0, ("GLOBAL_BATCH_SIZE", self.global_batch_size))
        if training and self.accumulate_steps > 1 and self.global_batch_size % (self.accumulate_steps * num_replicas):
            multiple = self.accumulate_steps * num_replicas
            raise ConfigError(f"GLOBAL_BATCH_SIZE={self.global_batch_size} does not divide by ACCUMULATE_STEPS="
                              f"{self.accumulate_steps} x the {num_replicas} replicas of this strategy ({multiple}): "
                              "each replica's micro-batch must be whole. Use a multiple of "
                              f"{multiple}, e.g. "
                              f"{how_to_set('global_batch_size', _nearest_multiple(self.global_batch_size, multiple))},"
                              " or a smaller ACCUMULATE_STEPS.")
        for name, value in batches:
            if value % num_replicas:
                lower = value // num_replicas * num_replicas
                raise ConfigError(f"{name}={value} does not divide by the {num_replicas} replicas of this strategy. "
                                  f"Use a multiple of {num_replicas}, e.g. {lower or num_replicas} or "
                                  f"{lower + num_replicas}.")

    def best_by(self) -> tuple[str, str]:
        """(metric, 'max' or 'min'): what evaluations are ranked by: BEST_METRIC and BEST_MODE resolved, or
        ('eval/loss', 'min') when no BEST_METRIC is set (metrics.json's "best" is then the lowest eval loss)."""
        metric = self.best_metric or "eval/loss"
        return metric, resolve_best_mode(metric, self.best_mode if self.best_metric else "auto")


def setting(field: str) -> str:
    """How a user sets `field`: its macro (configs/base.gin) if it has one, else experiment.<field>."""
    return field.upper() if field in MACRO_FIELDS else f"experiment.{field}"


def how_to_set(field: str, value) -> str:
    """The command-line flag that sets `field` to `value`, e.g. --gin_param="experiment.checkpoints_to_keep=3"."""
    return f'--gin_param="{setting(field)}={value!r}"'


def resolve_best_mode(metric: str, mode: str) -> str:
    """'max' or 'min' for ranking by `metric`; 'auto' is 'min' for losses and errors, else 'max'. `mode` was checked
    by ExperimentConfig."""
    if mode in ("max", "min"):
        return mode
    return "min" if any(word in metric for word in ("loss", "error")) else "max"


def _nearest_multiple(value: int, multiple: int) -> int:
    """The multiple of `multiple` nearest to `value` (at least `multiple`)."""
    return max(multiple, round(value / multiple) * multiple)


def _require_int(name: str, value, *, minimum: int, maximum: int | None = None, why: str = "") -> None:
    """A ConfigError unless `value` is an int (not a bool) in [minimum, maximum]; `why` explains the maximum."""
    default = next(field.default for field in dataclasses.fields(ExperimentConfig) if field.name == name)
    example = default if isinstance(default, int) and default >= minimum else _INT_EXAMPLES.get(name, minimum)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{setting(name)}={value!r} must be an integer >= {minimum}; e.g. "
                          f"{how_to_set(name, example)}.")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{setting(name)}={value!r} is above the limit {maximum} ({why}); e.g. "
                          f"{how_to_set(name, _INT_EXAMPLES.get(name, example))}.")


def check_profile_steps(profile_steps) -> tuple[int, int] | None:
    """PROFILE_STEPS as (start, stop) with 0 <= start < stop, or None; a ConfigError otherwise."""
    if profile_steps is None:
        return None
    if not isinstance(profile_steps, (tuple, list)) or len(profile_steps) != 2 or \
            not all(isinstance(value, int) and not isinstance(value, bool) for value in profile_steps) or \
            not 0 <= profile_steps[0] < profile_steps[1] <= MAX_STEPS:
        raise ConfigError(f"PROFILE_STEPS={profile_steps!r} must be (start, stop) with 0 <= start < stop <= "
                          f"{MAX_STEPS} (2**31 - 1), e.g. --gin_param=\"PROFILE_STEPS=(200, 300)\", or None.")
    return tuple(profile_steps)
