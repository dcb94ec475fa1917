"""Parses gin config files and bindings into gin's global state, turning every gin failure into a ConfigError.

Importing the modules that declare configurables happens here, before parsing, so a binding such as
`mlp.hidden_units = (512,)` always finds its target. Every `include` is checked to exist first (gin itself fails
with a TypeError), and a macro that no configuration uses (`--gin_param="FOO=1"`, a misspelt `TRAIN_STEP=5`) is an
error rather than silently ignored.
"""

import difflib
import importlib
import os
import re

import gin

from common.errors import ConfigError
from common.settings import MACRO_FIELDS

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # Where `include 'configs/...'` is found.
DEFAULT_GIN_FILE = "configs/default.gin"  # The offline digits experiment: what train.py runs with no --gin_file.
# Modules whose @gin.configurable functions a config may bind.
CONFIGURABLE_MODULES = ("training.experiment", "training.learning.losses", "training.learning.optimizers",
                        "models.registry")
# Macros without a default in configs/base.gin: each experiment must set them.
REQUIRED_MACROS = ("MODEL", "DATASET", "GLOBAL_BATCH_SIZE", "TRAIN_STEPS", "LEARNING_RATE")


def parse(gin_files: list[str], gin_params: list[str], *, search_path: str) -> None:
    """Clears gin, then applies `gin_files` in order and `gin_params` after them (bindings win). The files (and their
    includes) are checked first, before the configurable modules load TensorFlow (~7 s): a missing or unreadable
    --gin_file answers at once."""
    resolved = [_resolve(path, search_path) for path in gin_files]
    _check_includes(resolved, gin_params, search_path)
    for module in CONFIGURABLE_MODULES:
        importlib.import_module(module)
    gin.clear_config()
    # `include 'configs/base.gin'` must work from any working directory. The repository root goes first in gin's
    # search list: after the cwd, gin's package-resource reader would take 'configs' for a (namespace) package and
    # fail. gin 0.5.0 (pinned, unchanged since 2021) only has an append API, hence the list edit.
    if search_path in gin.config._LOCATION_PREFIXES:
        gin.config._LOCATION_PREFIXES.remove(search_path)
    gin.config._LOCATION_PREFIXES.insert(0, search_path)
    try:
        gin.parse_config_files_and_bindings(resolved, gin_params, finalize_config=False)
        missing = [name for name in REQUIRED_MACROS if not _is_bound(name)]
        if missing:
            raise ConfigError(f"The configuration {gin_files} does not set {', '.join(missing)}. Every experiment "
                              f"sets {', '.join(REQUIRED_MACROS)} (see configs/experiments/digits_mlp.gin), or pass "
                              f"them with --gin_param=\"{missing[0]}=...\".")
        _check_macros_used()
        gin.finalize()
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - gin reports bad input as any of a dozen exception types.
        detail = " | ".join(line.strip() for line in str(error).splitlines()
                            if line.strip() and "<ast." not in line)  # Python's AST repr says nothing to a user.
        raise ConfigError(f"Could not parse the gin configuration {gin_files} + {gin_params}: "
                          f"{type(error).__name__}: {detail}{_token_hint(str(error), gin_params)}") from error


def _token_hint(message: str, gin_params: list[str]) -> str:
    """For gin's "Failed to parse token 'x'": which binding holds it and how to write a value (a Python literal: a
    number, True/False, a quoted string, or a @configurable or %MACRO reference)."""
    token = re.search(r"Failed to parse token '([^']*)'", message)
    if not token:
        return ""
    holder = next((param for param in gin_params if token.group(1) in param.partition("=")[2]), None)
    name = holder.partition("=")[0].strip() if holder else "NAME"
    return (f". Gin values are Python literals: {token.group(1)!r} is neither a number, True/False, a quoted string "
            f"nor a @configurable or %MACRO reference; e.g. --gin_param=\"{name}=0.999\" for a number or "
            f"--gin_param=\"{name}='{token.group(1)}'\" for a string.")


def _resolve(path: str, search_path: str) -> str:
    """`path` as given if it exists, else relative to `search_path`; a ConfigError if neither exists."""
    for candidate in (path, os.path.join(search_path, path)):
        if os.path.isfile(candidate):
            return candidate
    if os.path.isdir(path):
        raise ConfigError(f"--gin_file={path!r} is a folder, not a gin file: pass a file in it, e.g. "
                          "configs/experiments/digits_mlp.gin.")
    raise ConfigError(f"--gin_file={path!r} does not exist (relative paths are tried from the current directory and "
                      f"from {search_path}). Configs live under configs/, e.g. configs/experiments/digits_mlp.gin.")


_INCLUDE = re.compile(r"""^\s*include\s+['"]([^'"]+)['"]""", re.MULTILINE)


def _check_includes(files: list[str], bindings: list[str], search_path: str) -> None:
    """A ConfigError naming the first `include` (in the files, recursively, or the bindings) that does not exist."""
    pending = [(path, read_gin_text(path)) for path in files] + [("--gin_param", "\n".join(bindings))]
    seen = set()
    while pending:
        source, text = pending.pop()
        for included in _INCLUDE.findall(text):
            candidates = [included, os.path.join(search_path, included),
                          os.path.join(os.path.dirname(source), included)]
            found = next((candidate for candidate in candidates if os.path.isfile(candidate)), None)
            if found is None:
                raise ConfigError(f"{source} includes {included!r}, which does not exist (tried from the current "
                                  f"directory and from {search_path}). Fix the path; configs live under configs/.")
            if os.path.abspath(found) not in seen:
                seen.add(os.path.abspath(found))
                pending.append((found, read_gin_text(found, included_by=source)))


def read_gin_text(path: str, *, included_by: str | None = None) -> str:
    """The text of gin file `path`; a ConfigError naming it if it is not UTF-8 text (a binary file, a file saved in
    another encoding, or a file with NUL bytes): gin would fail on it with a decoding traceback."""
    where = f"{path} (included by {included_by})" if included_by else f"--gin_file={path!r}"
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:  # No read permission, or a path that stopped being a file.
        raise ConfigError(f"{where} cannot be read ({error.strerror}): pass a readable gin config file, e.g. "
                          "configs/experiments/digits_mlp.gin (check its permissions: chmod a+r).") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{where} is not UTF-8 gin text (byte {error.start} is {data[error.start]:#04x}): pass a "
                          "gin config file, e.g. configs/experiments/digits_mlp.gin, or save it as UTF-8.") from None
    if "\x00" in text:
        raise ConfigError(f"{where} is not gin text (it holds NUL bytes, at byte {data.index(0)}: a binary file?): "
                          "pass a gin config file, e.g. configs/experiments/digits_mlp.gin.")
    return text


def _check_macros_used() -> None:
    """A ConfigError for a macro bound but never referenced as %NAME: a typo or a setting that does nothing. The
    shipped macros of experiment's fields (configs/base.gin) are left alone: one goes unreferenced when its field is
    bound directly (experiment.train_steps=5), which is gin's own way and wins."""
    bound = {scope for scope, selector in gin.config._CONFIG if selector == "gin.macro"}
    referenced = set()

    def walk(value):
        if isinstance(value, gin.config.ConfigurableReference):
            if value.configurable.name == "macro":
                referenced.add(value.scopes[-1] if value.scopes else "")
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple, set)):
            for item in value:
                walk(item)

    walk(list(gin.config._CONFIG.values()))
    unknown = sorted(name for name in bound - referenced if name.lower() not in MACRO_FIELDS)
    if unknown:
        known = sorted(referenced)
        hints = [f"{name} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(name, known, n=1))
                 else name for name in unknown]
        raise ConfigError(f"Unknown macro {', '.join(hints)}: no configuration uses it. Known macros: "
                          f"{', '.join(known)}. Remove it, or bind an argument instead (e.g. "
                          "--gin_param=\"mlp.hidden_units=(512,)\").")


def _is_bound(name: str) -> bool:
    try:
        macro(name)
    except ValueError:
        return False
    return True


def macro(name: str):
    """The value of a gin macro (e.g. 'TRAIN_STEPS') as currently bound."""
    return gin.query_parameter(f"{name}/macro.value")
