"""Variables chosen by path patterns: which ones a warm start loads (experiment.init_include / init_exclude) and
which ones training updates (experiment.trainable / experiment.frozen).

A variable's path is its Keras path, `<layer name>/<variable name>` (e.g. 'conv2d/kernel', 'logits/bias'; nested
layers add their names in front). A pattern is a glob (fnmatch: `*`, `?`, `[...]`) unless it starts with 're:', then
the rest is a regular expression; either must match the whole path or a leading part of it that ends before a '/', so
'logits' selects 'logits/kernel' and 'logits/bias', and 'batch_normalization*' every BatchNormalization layer's
variables. A pattern that matches no variable of the model is a ConfigError (a typo would otherwise do nothing).

Freezing: a frozen variable is not given to the optimizer (it has no slots and is never updated). A layer whose
trainable variables are all frozen gets `layer.trainable = False`, which in Keras 3 also runs BatchNormalization in
inference mode (its moving statistics are used and not updated): a frozen backbone stays exactly what was loaded.
A BatchNormalization layer with only some of its variables frozen (e.g. 'batch_normalization/gamma') still
normalises by batch statistics in training.
"""

import fnmatch
import re

from common.errors import ConfigError


def matches(pattern: str, path: str) -> bool:
    """Whether `pattern` (a glob, or 're:' + a regular expression) matches `path` or a leading part of it ending at a
    '/' (see the module docstring)."""
    parts = path.split("/")
    candidates = ["/".join(parts[:end]) for end in range(len(parts), 0, -1)]
    if pattern.startswith("re:"):
        expression = re.compile(pattern[3:])
        return any(expression.fullmatch(candidate) for candidate in candidates)
    return any(fnmatch.fnmatchcase(candidate, pattern) for candidate in candidates)


def check_patterns(setting: str, patterns) -> tuple[str, ...]:
    """`patterns` as a tuple of strings; a ConfigError naming `setting` for anything else or a bad expression."""
    if isinstance(patterns, str) or not all(isinstance(pattern, str) and pattern for pattern in patterns):
        raise ConfigError(f"{setting}={patterns!r} must be a list of variable-path patterns, e.g. "
                          f"--gin_param=\"{setting}=['logits']\" (globs, or 're:' + a regular expression).")
    for pattern in patterns:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as error:
                raise ConfigError(f"{setting}: the pattern {pattern!r} is not a regular expression ({error}); fix "
                                  "it, or drop the 're:' to use a glob.") from error
    return tuple(patterns)


def select(paths: list[str], *, include: tuple[str, ...], exclude: tuple[str, ...], include_setting: str,
           exclude_setting: str) -> list[bool]:
    """For each path: chosen (matched by an `include` pattern, or `include` empty, and by no `exclude` pattern). A
    pattern matching none of `paths` is a ConfigError naming its setting and the paths there are."""
    for setting, patterns in ((include_setting, include), (exclude_setting, exclude)):
        for pattern in patterns:
            if not any(matches(pattern, path) for path in paths):
                raise ConfigError(f"{setting}: the pattern {pattern!r} matches no variable of the model; its "
                                  f"variables are {', '.join(paths)}. Fix the pattern (globs, or 're:' + a regular "
                                  "expression, on these paths).")
    return [(not include or any(matches(pattern, path) for pattern in include))
            and not any(matches(pattern, path) for pattern in exclude) for path in paths]


def freeze(model, *, trainable: tuple[str, ...], frozen: tuple[str, ...]) -> tuple[list, list]:
    """Applies experiment.trainable / experiment.frozen to `model`: returns (the variables to train, in
    model.trainable_variables order, the frozen variables). With neither set: (model.trainable_variables, []),
    untouched. Layers whose trainable variables are all frozen get `trainable = False` (module docstring)."""
    variables = list(model.trainable_variables)
    if not trainable and not frozen:
        return variables, []
    chosen = select([variable.path for variable in variables], include=trainable, exclude=frozen,
                    include_setting="experiment.trainable", exclude_setting="experiment.frozen")
    if not any(chosen):
        raise ConfigError(f"experiment.trainable={list(trainable)!r} / experiment.frozen={list(frozen)!r} leave no "
                          "variable to train: set experiment.frozen to the part to keep fixed only.")
    frozen_ids = {id(variable) for variable, keep in zip(variables, chosen, strict=True) if not keep}
    for layer in model._flatten_layers(include_self=False, recursive=True):
        own = layer.trainable_weights
        if own and all(id(variable) in frozen_ids for variable in own):
            layer.trainable = False  # Also: BatchNormalization in inference mode.
    return ([variable for variable, keep in zip(variables, chosen, strict=True) if keep],
            [variable for variable, keep in zip(variables, chosen, strict=True) if not keep])


def frozen_layer_variables(model) -> set[int]:
    """ids of every variable of a layer with `trainable = False` (frozen ones and their BatchNormalization
    statistics): not averaged over replicas after a loop, since nothing changes them."""
    return {id(variable) for layer in model._flatten_layers(include_self=False, recursive=True)
            if not layer.trainable for variable in layer.weights}
