"""The core's only door to the extras: a forker may delete an extra's folder, and a run that needs it says so.

The core (what every run executes: train.py, training/, data/ but its stage/ folder, tasks/, models/, tpu_utils/,
serving/, common/) never imports an extra at module level (tests/test_layout.py checks it). Where a run needs one,
for a gs:// path, it is loaded here, by name; if the folder is gone, the run stops with exit 2 naming the folder and
how to get it back, instead of an ImportError traceback.
"""

import importlib

from common.errors import ConfigError

# The extras a core module may load, and what each is for (the folder to restore is the module's package).
EXTRAS = {"gcs.bucket_checks": "gs:// paths (bucket checks)", "gcs.run_lock": "a gs:// model_dir (its run lock)"}


def load(module: str):
    """The extra `module` (a key of EXTRAS), imported now; a ConfigError if its folder was deleted."""
    needed_for = EXTRAS[module]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        folder = module.split(".")[0] + "/"
        if error.name is None or not module.startswith(error.name):
            raise  # Something the extra itself imports is missing: its own error says what.
        raise ConfigError(f"{folder} is needed for {needed_for}, and it is not in this checkout: restore it "
                          f"(git checkout origin/main -- {folder}), or use local paths.") from error


def check_gcs_paths(paths: dict, **options) -> None:
    """gcs.bucket_checks.check_gcs_paths for the gs:// values of `paths`; nothing is loaded when there are none."""
    if any(isinstance(path, str) and path.startswith("gs://") for path in paths.values()):
        load("gcs.bucket_checks").check_gcs_paths(paths, **options)
