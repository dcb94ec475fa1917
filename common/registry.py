"""Name registries' one lookup: `MODEL='cnn'`, `DATASET='digits'`, `experiment.loss='focal'`, ... are keys of plain
dicts (models/registry.py MODELS, data/registry.py DATASETS, training/learning/ LOSSES, METRICS, OPTIMIZERS,
SCHEDULES, training/observers/standard.py OBSERVERS), and an unknown one is the same clear error everywhere: what
was asked for, every known name, and where a new one is registered."""

from common.errors import ConfigError


def lookup(table: dict, name, *, named: str, known: str, where: str, note: str = "", hint: str = ""):
    """`table[name]`; else a ConfigError: 'Unknown {named}. Known {known}: a, b{note}. Register a new one in
    {where}{hint}.'"""
    try:
        return table[name]
    except (KeyError, TypeError):  # TypeError: an unhashable value (a gin list where a name was meant).
        raise ConfigError(f"Unknown {named}. Known {known}: {', '.join(sorted(table))}{note}. Register a new one in "
                          f"{where}{hint}.") from None
