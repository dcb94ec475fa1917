"""How an experiment setting is named in a message and checked: the shared vocabulary of every settings check.

Each setting of `experiment` (training/config.py) is checked by the module that uses it (its `check_settings`);
those checks name a setting as the user sets it, with the flag that fixes it, through these functions.
"""

from common.errors import ConfigError
from common.registry import meant_name

# The fields configs/base.gin binds to a macro of the same name in upper case (docs/configuration.md, "Macros"): an
# error names them as the macro (MODEL=...). Every other field is set as experiment.<field> (tests/test_configs.py
# checks this set against base.gin).
MACRO_FIELDS = frozenset({"strategy", "virtual_devices", "tpu", "model", "dataset", "data_dir", "data_service",
                          "global_batch_size",
                          "train_steps", "steps_per_loop", "accumulate_steps", "ema_decay", "checkpoint_every",
                          "eval_every", "learning_rate", "precision", "seed", "best_metric", "best_mode",
                          "early_stop_patience", "profile_steps", "profiler_port", "init_from"})

# Step settings are at most 2**31 - 1: the on-device loop counts a loop's steps, and evaluation its batches, in int32
# (training/trainer.py, tpu_utils/loop.py); a larger count overflows into negative steps.
MAX_STEPS = 2 ** 31 - 1


def setting(field: str) -> str:
    """How a user sets `field`: its macro (configs/base.gin) if it has one, else experiment.<field>."""
    return field.upper() if field in MACRO_FIELDS else f"experiment.{field}"


def how_to_set(field: str, value) -> str:
    """The command-line flag that sets `field` to `value`, e.g. --gin_param="experiment.checkpoints_to_keep=3"."""
    return f'--gin_param="{setting(field)}={value!r}"'


def require_int(name: str, value, *, minimum: int, example: int, maximum: int | None = None, why: str = "",
                limit_example: int | None = None) -> None:
    """A ConfigError unless `value` is an int (not a bool) in [minimum, maximum]; `why` explains the maximum;
    `example` (and `limit_example` above the maximum) is the value the message suggests."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{setting(name)}={value!r} must be an integer >= {minimum}; e.g. "
                          f"{how_to_set(name, example)}.")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{setting(name)}={value!r} is above the limit {maximum} ({why}); e.g. "
                          f"{how_to_set(name, example if limit_example is None else limit_example)}.")


def require_choice(name: str, value, choices: tuple) -> None:
    """A ConfigError unless `value` is one of `choices`, suggesting the one meant (True for 'on', 'Float32', ...)."""
    if value not in choices:
        meant = meant_name(value, choices)
        raise ConfigError(f"{setting(name)}={value!r} is not one of {', '.join(map(repr, choices))}; "
                          f"{'did you mean' if meant else 'e.g.'} {how_to_set(name, meant or choices[0])}"
                          f"{'?' if meant else '.'}")


def require_names(name: str, value, example: str) -> tuple[str, ...] | None:
    """A gin list of names as a tuple (so the config stays hashable), None as None; a ConfigError otherwise."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(item, str)
                                                                               for item in value):
        raise ConfigError(f"{setting(name)}={value!r} must be a list of {name.rstrip('s')} names, e.g. "
                          f"--gin_param=\"{setting(name)}={example}\".")
    return tuple(value)


def nearest_multiple(value: int, multiple: int) -> int:
    """The multiple of `multiple` nearest to `value` (at least `multiple`)."""
    return max(multiple, round(value / multiple) * multiple)
