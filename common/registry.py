"""Name registries' one lookup: `MODEL='cnn'`, `DATASET='digits'`, `experiment.loss='focal'`, ... are keys of plain
dicts (models/registry.py MODELS, data/registry.py DATASETS, training/learning/ LOSSES, METRICS, OPTIMIZERS,
SCHEDULES, training/observers/standard.py OBSERVERS, tasks/augmentation/by_name.py AUGMENTATIONS), and an unknown one is
the same clear error everywhere: what was asked for, the name it probably meant (another case, a stray space, a typo),
every known name, and where a new one is registered."""

import difflib

from common.errors import ConfigError


def lookup(table: dict, name, *, named: str, known: str, where: str, note: str = "", hint: str = ""):
    """`table[name]`; else a ConfigError: 'Unknown {named} (did you mean 'x'?). Known {known}: a, b{note}. Register a
    new one in {where}{hint}.'"""
    try:
        return table[name]
    except (KeyError, TypeError):  # TypeError: an unhashable value (a gin list where a name was meant).
        meant = meant_name(name, table)
        guess = f" (did you mean {meant!r}?)" if meant else ""
        raise ConfigError(f"Unknown {named}{guess}. Known {known}: {', '.join(sorted(table))}{note}. Register a "
                          f"new one in {where}{hint}.") from None


def meant_name(value, known) -> str | None:
    """The name of `known` that `value` probably meant: the same name in another case or with stray spaces, else the
    closest spelling (difflib, ratio >= 0.6); 'on'/'off' for True/False where those are names; None if none is close."""
    names = [name for name in known if isinstance(name, str)]
    if isinstance(value, bool):
        wanted = "on" if value else "off"
        return wanted if wanted in names else None
    if not isinstance(value, str):
        return None
    normalised = {name.lower(): name for name in names}
    typed = value.strip().lower()
    close = [typed] if typed in normalised else difflib.get_close_matches(typed, list(normalised), n=1, cutoff=0.6)
    return normalised[close[0]] if close else None
