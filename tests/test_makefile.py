"""The shortcuts and documented commands run what exists: every module (`-m NAME`) and script (`*.py`) that a make
target's recipe names (as `make -n` prints it), and every `python -m ...` / `python path.py` in the README and in every
page under docs/ can be found (a moved launcher once left `make train-two-workers` broken)."""

import glob
import importlib.util
import os
import re
import subprocess

import pytest

from helpers import REPO_ROOT

# README.md and every page under docs/: a new page is checked without being listed here.
DOC_PAGES = ["README.md"] + sorted(os.path.relpath(path, REPO_ROOT)
                                   for path in glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))


def _targets() -> list[str]:
    return re.findall(r"^([a-z-]+):.*## ", open(os.path.join(REPO_ROOT, "Makefile")).read(), flags=re.M)


def missing_in(commands: str) -> list[str]:
    """The modules and script paths in `commands` that do not exist in the repository (or installed)."""
    missing = [module for module in re.findall(r"(?<!pytest )-m ([\w.]+)", commands)  # Not pytest's -m MARKER.
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


def _python_commands(page: str) -> str:
    return " ".join(re.findall(r"python3? (?:-m [\w.]+|[\w/-]+\.py)", open(os.path.join(REPO_ROOT, page)).read()))


@pytest.mark.parametrize("page", DOC_PAGES)
def test_every_python_command_in_the_docs_names_a_module_or_script_that_exists(page):
    commands = _python_commands(page)
    assert not missing_in(commands), f"{page} runs {missing_in(commands)}, which do not exist"


def test_the_command_pattern_finds_the_readmes_commands():
    """Guards the pattern above: a page with no match passes, so the README's own commands must be found."""
    assert "python -m tools.predict" in _python_commands("README.md")
