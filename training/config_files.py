"""Parses gin config files and bindings into gin's global state, turning every gin failure into a ConfigError.

Importing the modules that declare configurables happens here, before parsing, so a binding such as
`mlp.hidden_units = (512,)` always finds its target.
"""

import importlib
import os

import gin

from training.errors import ConfigError

# Modules whose @gin.configurable functions a config may bind.
CONFIGURABLE_MODULES = ("training.experiment", "training.losses", "training.optimizers", "models.registry")
# Macros without a default in configs/base.gin: each experiment must set them.
REQUIRED_MACROS = ("MODEL", "DATASET", "GLOBAL_BATCH_SIZE", "TRAIN_STEPS", "LEARNING_RATE")


def parse(gin_files: list[str], gin_params: list[str], *, search_path: str) -> None:
    """Clears gin, then applies `gin_files` in order and `gin_params` after them (bindings win)."""
    for module in CONFIGURABLE_MODULES:
        importlib.import_module(module)
    gin.clear_config()
    # `include 'configs/base.gin'` must work from any working directory. The repository root goes first in gin's
    # search list: after the cwd, gin's package-resource reader would take 'configs' for a (namespace) package and
    # fail. gin 0.5.0 (pinned, unchanged since 2021) only has an append API, hence the list edit.
    if search_path in gin.config._LOCATION_PREFIXES:
        gin.config._LOCATION_PREFIXES.remove(search_path)
    gin.config._LOCATION_PREFIXES.insert(0, search_path)
    resolved = [_resolve(path, search_path) for path in gin_files]
    try:
        gin.parse_config_files_and_bindings(resolved, gin_params, finalize_config=False)
        missing = [name for name in REQUIRED_MACROS if not _is_bound(name)]
        if missing:
            raise ConfigError(f"The configuration {gin_files} does not set {', '.join(missing)}. Every experiment "
                              f"sets {', '.join(REQUIRED_MACROS)} (see configs/experiments/digits_mlp.gin), or pass "
                              f"them with --gin_param=\"{missing[0]}=...\".")
        gin.finalize()
    except ConfigError:
        raise
    except (ValueError, IOError, SyntaxError, KeyError) as error:
        raise ConfigError(f"Could not parse the gin configuration {gin_files} + {gin_params}: {error}") from error


def _resolve(path: str, search_path: str) -> str:
    """`path` as given if it exists, else relative to `search_path`; a ConfigError if neither exists."""
    for candidate in (path, os.path.join(search_path, path)):
        if os.path.isfile(candidate):
            return candidate
    raise ConfigError(f"--gin_file={path!r} does not exist (relative paths are tried from the current directory and "
                      f"from {search_path}). Configs live under configs/, e.g. configs/experiments/digits_mlp.gin.")


def _is_bound(name: str) -> bool:
    try:
        macro(name)
    except ValueError:
        return False
    return True


def macro(name: str):
    """The value of a gin macro (e.g. 'TRAIN_STEPS') as currently bound."""
    return gin.query_parameter(f"{name}/macro.value")
