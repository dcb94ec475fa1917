"""What is core and what is extra, and the core's only door to the extras.

FOLDERS is the one list of the extras: folders a fork may delete. The core (everything else: train.py, training/,
data/, tasks/, models/, tpu_utils/, serving/, common/) never imports an extra (tests/test_layout.py checks it,
tests/test_core_alone.py trains and runs the core's tests in a copy without them, and README's code map must name
exactly these). Where a run needs one, for a gs:// path, it is loaded here, by name; if the folder is gone, the run
stops with exit 2 naming the folder and how to get it back, instead of an ImportError traceback.
"""

import importlib

from common.errors import ConfigError

# The extras, by folder, and what each holds.
FOLDERS = {
    "scripts": "launchers: TPU VMs, local multi-worker jobs, TPU start-up as exports",
    "tools": "compare runs, predictions of an export, TPU config checks",
    "stage": "staging your own data (python -m stage)",
    "gcs": "gs:// support: the run lock of a gs:// model_dir, bucket checks",
    "bench": "benchmarks",
}

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
