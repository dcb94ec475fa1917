"""What a resumed run must share with the run that wrote its checkpoint, recorded in model_dir/run_identity.json.

Refused on resume when changed (exit 2, naming the setting and both values): GLOBAL_BATCH_SIZE, SEED, MODEL,
DATASET (the data order and the weights), PRECISION and experiment.optimizer (the checkpoint's variables and
their dtypes), and the data itself (`data_identity`): the dataset's TFDS name and version, and for data staged with
`python -m stage` the digest of its source's fingerprint (data/staged_source.py), so `python -m stage --force`
with other data under a run's dataset is not resumed on. The model builder's settings (e.g. `cnn.filters`) are
recorded too: they may change on resume when the weights still fit (dropout, L2), and when they do not, the failed
restore names the changed ones. Keys missing from an older run_identity.json are not compared, except EMA_DECAY:
recorded only when EMA is on, so its presence is the switch, and switching EMA on or off on resume is refused (the
checkpoint would lack the averages, or hold averages nothing updates); its value may change (it is not in the
weights' shapes, like LEARNING_RATE).

EVAL_EVERY, BEST_METRIC and BEST_MODE are recorded too: a resume may change them, but a sidecar evaluator
(--mode=continuous_eval) must share them with the training job, since they decide which of the two keeps best/
(training/run_directory/record.py keeps_best).
"""

import json

from common.errors import ConfigError
from data import staged_source
from training.run_directory.history import ranked_by

STRICT_KEYS = ("GLOBAL_BATCH_SIZE", "SEED", "MODEL", "DATASET", "PRECISION", "experiment.optimizer", "DATA_VERSION")
SIDECAR_KEYS = ("EVAL_EVERY", "BEST_METRIC", "BEST_MODE")  # Who keeps best/: the same for a sidecar.


def run_identity(config, model_settings: dict | None = None, data: dict | None = None) -> dict:
    """The identity of `config` as JSON values; `model_settings` as {'cnn.filters': (32, 64), ...}; `data` as
    `data_identity` gives it."""
    identity = {"GLOBAL_BATCH_SIZE": config.global_batch_size, "SEED": config.seed, "MODEL": config.model,
                "DATASET": config.dataset, "PRECISION": config.precision, "experiment.optimizer": config.optimizer,
                **({"EMA_DECAY": config.ema_decay} if config.ema_decay else {}),
                "EVAL_EVERY": config.eval_every, "BEST_METRIC": config.best_metric,
                "BEST_MODE": ranked_by(config)[1] if config.best_metric else None,
                **(data or {}), **(model_settings or {})}
    return json.loads(json.dumps(identity))  # Tuples as lists, as they read back from the file.


def data_identity(builder) -> dict:
    """The data a run trains on, from its prepared TFDS `builder`: DATA_VERSION ('NAME VERSION'); for a dataset
    staged with `python -m stage` also DATA_FINGERPRINT (the digest of its source's fingerprint) and DATA_STAGED (its
    source and time of staging, for messages only). A staged dataset without a fingerprint (staged by an older
    `python -m stage`) has no DATA_FINGERPRINT: nothing to compare."""
    identity = {"DATA_VERSION": f"{builder.name} {builder.version}"}
    staged = staged_source.read(builder.data_dir)
    if staged is not None:
        identity["DATA_FINGERPRINT"] = staged_source.digest(staged)
        identity["DATA_STAGED"] = f"{staged.get('source')}, staged {staged.get('staged', 'at an unrecorded time')}"
        settings = staged.get("settings")
        if isinstance(settings, dict):  # The staging flags, to name the one that changed (--image_size, --label...).
            identity["DATA_STAGED_SETTINGS"] = {flag: value for flag, value in settings.items() if value is not None}
    return identity


def changes(previous: dict, current: dict, keys=None) -> list[str]:
    """'KEY: checkpoint OLD, now NEW' for each of `keys` (default: all) recorded in both and different.

    Keys missing from `previous` (a run directory of an older version of this template) are not compared.
    """
    keys = current if keys is None else keys
    return [f"{key}: checkpoint {previous[key]!r}, now {current[key]!r}" for key in keys
            if key in previous and key in current and previous[key] != current[key]]


def _staging_difference(previous: dict, current: dict) -> str:
    """' with --image_size=64,64 (the checkpoint's data: --image_size=32,32)' for the staging flags that differ
    between the two runs' data; ' from another source' when none recorded differs (the files' contents do)."""
    before, now = previous.get("DATA_STAGED_SETTINGS"), current.get("DATA_STAGED_SETTINGS")
    if not (isinstance(before, dict) and isinstance(now, dict)):
        return " from another source"
    flags = sorted(flag for flag in set(before) | set(now) if before.get(flag) != now.get(flag))
    if not flags:
        return " from another source"

    def given(settings: dict) -> str:
        return " ".join(f"--{flag}={settings[flag]}" if flag in settings else f"no --{flag}" for flag in flags)
    return f" with {given(now)} (the checkpoint's data: {given(before)})"


def check_resume(previous: dict | None, current: dict, *, model_dir: str, data_dir: str | None = None) -> None:
    """A ConfigError if a setting of STRICT_KEYS, or the staged data's fingerprint, differs from the checkpoint's
    run."""
    previous = previous or {}
    if changes(previous, current, ["DATA_FINGERPRINT"]) and not changes(previous, current, ["DATASET"]):
        where = f" in {data_dir}" if data_dir else ""
        raise ConfigError(f"{model_dir} holds a checkpoint of a run on other data: DATASET={current['DATASET']!r}"
                          f"{where} was staged again{_staging_difference(previous, current)} since (the checkpoint's "
                          f"{previous['DATA_FINGERPRINT']} from {previous.get('DATA_STAGED', 'an unrecorded source')}; "
                          f"now {current['DATA_FINGERPRINT']} from {current.get('DATA_STAGED')}). Resuming would "
                          "continue the run on other data: pass a new --model_dir to train on this data from scratch, "
                          "or stage the old data again (python -m stage --force with the checkpoint's source) to "
                          "resume.")
    if previous and ("EMA_DECAY" in previous) != ("EMA_DECAY" in current):
        was, now = (f"EMA_DECAY={identity['EMA_DECAY']!r}" if "EMA_DECAY" in identity else "EMA off"
                    for identity in (previous, current))
        raise ConfigError(f"{model_dir} holds a checkpoint of a run with {was}; this run has {now}. EMA cannot be "
                          "switched on or off on resume (its averages are in the checkpoint or not): resume with "
                          f"--gin_param=\"EMA_DECAY={previous.get('EMA_DECAY')!r}\", or pass a new --model_dir to "
                          "start afresh.")
    changed = changes(previous, current, STRICT_KEYS)
    if changed:
        raise ConfigError(f"{model_dir} holds a checkpoint of a different run ({', '.join(changed)}). Resuming "
                          "would break the data order or the weights: restore the old values, or pass a new "
                          "--model_dir to start afresh.")


def check_sidecar(previous: dict | None, current: dict, *, model_dir: str) -> None:
    """A ConfigError if a sidecar's EVAL_EVERY, BEST_METRIC or BEST_MODE differ from the training job's: with
    BEST_METRIC set, they decide which of the two keeps best/, and two writers of it would interleave."""
    previous = previous or {}
    if not (previous.get("BEST_METRIC") or current.get("BEST_METRIC")):
        return
    changed = [key for key in SIDECAR_KEYS if key in previous and previous[key] != current[key]]
    if changed:
        settings = ", ".join(f"{key}={previous[key]!r} (this sidecar: {current[key]!r})" for key in changed)
        fix = " ".join(f'--gin_param="{key}={previous[key]!r}"' for key in changed)
        raise ConfigError(f"The training job of {model_dir} runs with {settings}: they decide whether the training "
                          "job or the sidecar keeps best/, and best/ has one writer (docs/sidecar_eval.md). Run the "
                          f"sidecar with the training job's gin files and bindings, here {fix}.")


def restore_mismatch_error(previous: dict | None, current: dict, *, checkpoint: str, error: Exception,
                           model_dir: str) -> ConfigError:
    """The ConfigError for a checkpoint whose variables do not fit the model built now (shape or dtype)."""
    changed = changes(previous or {}, current, [key for key in current if key not in SIDECAR_KEYS])
    what = f"Changed since the checkpoint: {', '.join(changed)}." if changed else \
        "run_identity.json records no changed setting (was the model code edited?)."
    first_line = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return ConfigError(f"{checkpoint} does not fit the model built now ({first_line[:200]}). {what} Restore the "
                       f"old values to resume, or pass a new --model_dir to train this model from scratch "
                       f"(the run in {model_dir} is left as it is).")
