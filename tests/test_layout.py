"""Dependencies point one way: entry points -> training -> serving, data, models, tasks, tpu_utils -> common.

Read from the source with `ast` (no imports run): a module of a lower layer importing a higher one fails, and so
does any reference to the developers' notes folder, which a fork does not have.
"""

import ast
import glob
import os

import pytest

from helpers import REPO_ROOT

# Package -> the first-party packages it may import.
ALLOWED = {
    "common": set(),
    "tasks": {"common"},
    "models": {"common"},
    "data": {"common", "tasks"},
    "tpu_utils": {"common"},
    "serving": {"common", "tasks"},
    "training": {"common", "data", "models", "serving", "tasks", "tpu_utils", "training"},
}
FIRST_PARTY = set(ALLOWED) | {"train", "scripts"}


def _imports(path: str) -> set[str]:
    tree = ast.parse(open(path).read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names & FIRST_PARTY


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_lower_layers(package):
    offenders = {}
    for path in glob.glob(os.path.join(REPO_ROOT, package, "**", "*.py"), recursive=True):
        wrong = _imports(path) - ALLOWED[package] - {package}
        if wrong:
            offenders[os.path.relpath(path, REPO_ROOT)] = sorted(wrong)
    assert not offenders, f"{package}/ may import only {sorted(ALLOWED[package])}: {offenders}"


def test_the_layout_check_catches_an_upward_import(tmp_path):
    """Negative control: a data module importing training is reported."""
    module = tmp_path / "bad.py"
    module.write_text("from training.trainer import Trainer\nimport common.errors\n")
    assert _imports(str(module)) - ALLOWED["data"] == {"training"}


def test_nothing_cites_files_outside_the_repository():
    notes = "shared" + "/notes"  # Spelled in two parts so that this file does not cite it.
    cited = []
    for pattern in ("**/*.py", "**/*.gin", "**/*.md", "**/*.ipynb", "Makefile"):
        for path in glob.glob(os.path.join(REPO_ROOT, pattern), recursive=True):
            if "/.venv/" not in path and notes in open(path, errors="replace").read():
                cited.append(os.path.relpath(path, REPO_ROOT))
    assert not cited, cited
