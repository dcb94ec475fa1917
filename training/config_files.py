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


def parse(gin_files: list[str], gin_params: list[str], *, search_path: str) -> None:
    """Clears gin, then applies `gin_files` in order and `gin_params` after them (bindings win)."""
    for module in CONFIGURABLE_MODULES:
        importlib.import_module(module)
    gin.clear_config()
    if search_path not in gin.config._LOCATION_PREFIXES:  # Makes `include 'configs/base.gin'` work from any cwd.
        gin.add_config_file_search_path(search_path)
    for path in gin_files:
        if not os.path.isfile(path) and not os.path.isfile(os.path.join(search_path, path)):
            raise ConfigError(f"--gin_file={path!r} does not exist (relative paths are tried from the current "
                              f"directory and from {search_path}). Configs live under configs/, e.g. "
                              "configs/experiments/digits_mlp.gin.")
    try:
        gin.parse_config_files_and_bindings(
            [path if os.path.isfile(path) else os.path.join(search_path, path) for path in gin_files], gin_params)
    except (ValueError, IOError, SyntaxError, KeyError) as error:
        raise ConfigError(f"Could not parse the gin configuration {gin_files} + {gin_params}: {error}") from error


def macro(name: str):
    """The value of a gin macro (e.g. 'TRAIN_STEPS') as currently bound."""
    return gin.query_parameter(f"{name}/macro.value")
