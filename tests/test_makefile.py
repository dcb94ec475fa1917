"""The shortcuts and documented commands run what exists: every module (`-m NAME`) and script (`*.py`) that a make
target's recipe names (as `make -n` prints it), and every `python -m ...` / `python path.py` in the README and the
guide, can be found (a moved launcher once left `make train-two-workers` broken)."""

import importlib.util
import os
import re
import subprocess

import pytest

from helpers import REPO_ROOT


def _targets() -> list[str]:
    return re.findall(r"^([a-z-]+):.*## ", open(os.path.join(REPO_ROOT, "Makefile")).read(), flags=re.M)


def missing_in(commands: str) -> list[str]:
    """The modules and script paths in `commands` that do not exist in the repository (or installed)."""
    missing = [module for module in re.findall(r"-m ([\w.]+)", commands)
               if module not in ("venv", "pytest") and importlib.util.find_spec(module) is None]
    missing += [path for path in re.findall(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.py)\b", commands)
                if not os.path.exists(os.path.join(REPO_ROOT, path))]
    return missing


@pytest.mark.parametrize("target", _targets())
def test_every_make_target_names_modules_and_scripts_that_exist(target):
    commands = subprocess.run(["make", "-n", target], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                              env={**os.environ, "BUCKET": "gs://bucket"}).stdout
    assert not missing_in(commands), f"make {target} runs {missing_in(commands)}, which do not exist:\n{commands}"


def test_the_check_names_a_moved_module_and_script():
    """Negative control: the recipe the launcher's move broke is reported."""
    assert missing_in(".venv/bin/python -m tpu_utils.launch_local --workers 2 -- train.py scripts/gone.py") == [
        "tpu_utils.launch_local", "scripts/gone.py"]


@pytest.mark.parametrize("page", ["README.md", "docs/make_it_yours.md", "docs/serving.md", "docs/testing.md"])
def test_every_python_command_in_the_docs_names_a_module_or_script_that_exists(page):
    commands = " ".join(re.findall(r"python3? (?:-m [\w.]+|[\w/-]+\.py)", open(os.path.join(REPO_ROOT, page)).read()))
    assert commands and not missing_in(commands), f"{page} runs {missing_in(commands)}, which do not exist"
