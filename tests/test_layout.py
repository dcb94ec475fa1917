"""The architecture, read from the source with `ast` (no imports run): layers, a core apart from its extras, and no
import circles.

- Dependencies point one way: entry points -> training -> serving, data, models, tasks, tpu_utils -> common.
- The core (what every run executes) never imports an extra, not even inside a function: the extras (launchers in
  scripts/, tools/, own-data staging in stage/, gs:// support in gcs/, bench/) can be deleted by a forker
  (tests/test_core_alone.py runs the default config without them). The core reaches gcs/ only through
  common/extras.py, by name, with a clear error when it is gone.
- No two modules import each other, directly or around a circle, lazy imports included: a circle that works only
  because one side imports inside a function is a circle.
- Nothing cites the developers' notes folder, which a fork does not have.
Each rule has a negative control.
"""

import ast
import glob
import os
import re

import pytest

from common import extras
from helpers import REPO_ROOT

# Package -> the first-party packages it may import.
ALLOWED = {
    "common": set(),
    "tasks": {"common"},
    "models": {"common"},
    "data": {"common", "tasks"},
    "tpu_utils": {"common"},
    "serving": {"common", "tasks"},
    "training": {"common", "data", "models", "serving", "tasks", "tpu_utils"},
    "gcs": {"common", "training"},
    "tools": {"common", "data", "models", "serving", "tasks", "tpu_utils", "training"},
    "scripts": {"common", "tpu_utils", "training"},
    "stage": {"common", "data", "tasks"},
}
FIRST_PARTY = set(ALLOWED) | {"train", "bench"}
# Module-name prefixes of the extras; everything else first-party (train.py included) is the core.
EXTRAS = tuple(folder.replace("/", ".") for folder in extras.FOLDERS)


def module_name(path: str) -> str:
    relative = os.path.relpath(path, REPO_ROOT)[:-len(".py")].replace(os.sep, ".")
    return relative[:-len(".__init__")] if relative.endswith(".__init__") else relative


def is_extra(module: str) -> bool:
    return any(module == extra or module.startswith(extra + ".") for extra in EXTRAS)


def imported_modules(path: str) -> set[str]:
    """The first-party modules `path` imports anywhere in it (functions included), as full dotted names:
    `from data import pipeline` is data.pipeline, `from data.spec import DatasetSpec` is data.spec."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                is_module = os.path.exists(os.path.join(REPO_ROOT, *full.split("."))) or \
                    os.path.exists(os.path.join(REPO_ROOT, *full.split(".")) + ".py")
                names.add(full if is_module else node.module)
    return {name for name in names if name.split(".")[0] in FIRST_PARTY}


def sources() -> list[str]:
    paths = [os.path.join(REPO_ROOT, "train.py")]
    for package in sorted(FIRST_PARTY - {"train"}):
        paths += glob.glob(os.path.join(REPO_ROOT, package, "**", "*.py"), recursive=True)
    return sorted(paths)


def import_graph() -> dict[str, set[str]]:
    return {module_name(path): imported_modules(path) for path in sources()}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_lower_layers(package):
    offenders = {}
    for path in glob.glob(os.path.join(REPO_ROOT, package, "**", "*.py"), recursive=True):
        wrong = {name.split(".")[0] for name in imported_modules(path)} - ALLOWED[package] - {package}
        if wrong:
            offenders[os.path.relpath(path, REPO_ROOT)] = sorted(wrong)
    assert not offenders, f"{package}/ may import only {sorted(ALLOWED[package])}: {offenders}"


def test_the_layout_check_catches_an_upward_import(tmp_path):
    """Negative control: a data module importing training is reported."""
    module = tmp_path / "bad.py"
    module.write_text("from training.trainer import Trainer\nimport common.errors\n")
    assert {name.split(".")[0] for name in imported_modules(str(module))} - ALLOWED["data"] == {"training"}


def core_imports_of_extras(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    return {module: sorted(name for name in imported if is_extra(name))
            for module, imported in graph.items() if not is_extra(module) and any(map(is_extra, imported))}


def test_the_core_never_imports_an_extra():
    assert not core_imports_of_extras(import_graph()), (
        "the core imports extras (load gs:// code through common/extras.py; move tools and launchers' helpers out "
        f"of the core): {core_imports_of_extras(import_graph())}")


def test_the_extras_check_catches_a_lazy_import_of_an_extra():
    """Negative control: a core module importing the staging command inside a function is reported."""
    graph = {**import_graph(), "training.planted": {"stage.cli", "common.errors"}}
    assert core_imports_of_extras(graph) == {"training.planted": ["stage.cli"]}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: its strongly connected components of more than one module (Tarjan's
    algorithm), plus modules that import themselves. A package's __init__ counts as the package's name."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph.get(module, ()):
            if other not in graph:
                continue
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in graph.get(module, ()):
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_circles_within_or_across_packages():
    assert not circles(import_graph()), f"import circles (lazy imports included): {circles(import_graph())}"


def test_the_circle_check_catches_a_circle_closed_by_a_lazy_import():
    """Negative control: data.pipeline importing a module that imports it back (inside a function) is reported."""
    graph = import_graph()
    graph = {**graph, "data.planted": {"data.pipeline"}, "data.pipeline": graph["data.pipeline"] | {"data.planted"}}
    assert ["data.pipeline", "data.planted"] in circles(graph)


def test_nothing_cites_files_outside_the_repository():
    notes = "shared" + "/notes"  # Spelled in two parts so that this file does not cite it.
    cited = []
    for pattern in ("**/*.py", "**/*.gin", "**/*.md", "**/*.ipynb", "Makefile"):
        for path in glob.glob(os.path.join(REPO_ROOT, pattern), recursive=True):
            if "/.venv/" not in path and notes in open(path, errors="replace").read():
                cited.append(os.path.relpath(path, REPO_ROOT))
    assert not cited, cited


def readme_extras(text: str) -> list[str]:
    """The folders README's code map names as extras: the backticked ones of its "extras a fork may delete" item,
    up to '; and' (tests/ and notebooks/ are no code a run could import)."""
    item = text.split("- extras a fork may delete", 1)[1].split("; and", 1)[0]
    return [name.rstrip("/") for name in re.findall(r"`([\w/]+/)`", item)]


def test_readme_names_exactly_the_extras_of_the_one_list():
    text = open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8").read()
    assert readme_extras(text) == list(extras.FOLDERS)
    # Negative control: a README that forgets one is caught.
    assert readme_extras(text.replace("`bench/`; and", "and")) != list(extras.FOLDERS)


def imports_of_test_module(path: str) -> set[str]:
    """What a test module imports: first-party modules (as `imported_modules`) and the tests' own modules (helpers,
    serving_runs, other test modules), by bare name."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    local = {os.path.basename(name)[:-3] for name in glob.glob(os.path.join(REPO_ROOT, "tests", "*.py"))}
    names = set(imported_modules(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("tests", *local):
            names.add(node.module.removeprefix("tests."))
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name in local)
    return names


def extras_reached(module: str, seen: set[str] | None = None) -> set[str]:
    """The extras a test module (bare name) imports, itself or through the tests' modules it imports."""
    seen = set() if seen is None else seen
    path = os.path.join(REPO_ROOT, "tests", f"{module}.py")
    if module in seen or not os.path.exists(path):
        return set()
    seen.add(module)
    found = set()
    for name in imports_of_test_module(path):
        if is_extra(name):
            found.add(name)
        elif "." not in name:
            found |= extras_reached(name, seen)
    return found


def test_the_cores_tests_import_no_extra():
    """`pytest -m core` runs in a fork without the extras (tests/test_core_alone.py): no core test module imports
    one, itself or through a test helper. (tests/conftest.py leaves out the other test modules of a deleted extra.)"""
    from conftest import CORE_TEST_MODULES

    offenders = {module: sorted(extras_reached(module)) for module in sorted(CORE_TEST_MODULES)
                 if extras_reached(module)}
    assert not offenders, offenders
    # Negative control: the extras' own tests are found importing them.
    assert extras_reached("test_run_lock_gcs") == {"gcs.run_lock"}
