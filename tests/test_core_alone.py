"""The core runs without its extras: a fork may delete scripts/, tools/, data/stage/, gcs/ and bench/ and still train
the default config (tests/test_layout.py checks the imports; this runs the result).

In a temporary copy of the repository's tracked files without the extras: `python train.py` trains the default
config to its stated result and exports; a gs:// model_dir stops with exit 2 naming gcs/ as the folder to restore
(before any storage is contacted). Negative control: the same copy without tasks/, a core folder, does not train.
"""

import ast
import os
import shutil
import subprocess
import sys

import pytest

from common.extras import FOLDERS
from helpers import REPO_ROOT

EXTRAS = tuple(FOLDERS)  # common/extras.py: the one list of the extras.


def copy_without(tmp_path, removed: tuple[str, ...]) -> str:
    files = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    root = tmp_path / "fork"
    for path in files.split():
        if any(path == folder or path.startswith(folder + "/") for folder in removed) or not \
                os.path.exists(os.path.join(REPO_ROOT, path)):
            continue
        os.makedirs(root / os.path.dirname(path), exist_ok=True)
        shutil.copy2(os.path.join(REPO_ROOT, path), root / path)
    return str(root)


def train(root: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ""})


@pytest.mark.slow
def test_the_default_config_trains_and_exports_without_the_extras(tmp_path):
    root = copy_without(tmp_path, EXTRAS)
    assert not any(os.path.exists(os.path.join(root, folder)) for folder in EXTRAS)
    result = train(root, f"--model_dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr[-3000:]
    final = ast.literal_eval(next(line for line in result.stdout.splitlines() if line.startswith("final: "))[7:])
    assert final["step"] == 1000 and final["eval"]["accuracy"] > 0.97, final  # configs/default.gin states 98.9%.
    assert os.path.exists(tmp_path / "run" / "export" / "1000" / "saved_model.pb")

    result = train(root, "--model_dir=gs://some-bucket/run", '--gin_param=TRAIN_STEPS=10')
    assert result.returncode == 2, result.stderr[-3000:]
    assert "gcs/ is needed for gs:// paths" in result.stderr and "git checkout" in result.stderr, result.stderr


def test_a_copy_without_a_core_folder_does_not_train(tmp_path):
    """Negative control: the check above can fail: without tasks/ the same command fails."""
    root = copy_without(tmp_path, EXTRAS + ("tasks",))
    result = train(root, f"--model_dir={tmp_path / 'run'}", "--gin_param=TRAIN_STEPS=10")
    assert result.returncode != 0 and "tasks" in result.stderr
