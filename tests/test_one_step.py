"""docs/one_step.md stays true. Its first table (the step) must equal a trace of what one step of a real default run
executes (tests/one_step_trace.py): the same files, in the order the step enters them, with the same line ranges; a
core file on the step's path that the page leaves out fails the test, and so does a row the step no longer runs. The
step stays within STEP_BOUND (files, lines). The second table (around the step) names core files a default run loads.
Negative controls: a page with a missing file, a wrong range, a file the step does not run and a bad second-table row
is reported once for each."""

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO_ROOT
from test_layout import is_extra

PAGE = os.path.join(REPO_ROOT, "docs", "one_step.md")
STEP_BOUND = (8, 1000)  # At most 8 files and 1,000 lines on one default step's path (Flax's ImageNet step: 5, 975).


def parse_ranges(text: str) -> list[list[int]]:
    return [[int(first), int(last)] for first, last in re.findall(r"(\d+)-(\d+)", text)]


def step_rows(text: str) -> list[list]:
    """[path, [[first, last], ...]] of the page's step table, in its order."""
    section = text.split("## The step", 1)[1].split("\n## ", 1)[0]
    return [[path, parse_ranges(ranges)]
            for path, ranges in re.findall(r"^\| \d+ \| `([\w/.]+)` \| ([\d, -]+) \|", section, flags=re.M)]


def around_rows(text: str) -> list[str]:
    section = text.split("## Around it", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| \d+ \| `([\w/.]+)` \|", section, flags=re.M)


def stated_step_totals(text: str) -> tuple[int, int]:
    files, lines = re.search(r"^## The step.*\((\d+) files, ([\d,]+) lines\)$", text, flags=re.M).groups()
    return int(files), int(lines.replace(",", ""))


def module_of(path: str) -> str:
    return path[:-len(".py")].replace("/", ".")


def step_problems(page: list[list], traced: list[list]) -> list[str]:
    found = []
    stated, ran = dict((path, ranges) for path, ranges in page), dict((path, ranges) for path, ranges in traced)
    for path, ranges in traced:
        if path not in stated:
            found.append(f"{path}: the step runs lines {ranges} of it; the page leaves it out")
        elif stated[path] != ranges:
            found.append(f"{path}: the page says lines {stated[path]}, the step runs {ranges}")
    found += [f"{path}: on the page, but the step runs none of it" for path in stated if path not in ran]
    if [path for path, _ in page if path in ran] != [path for path, _ in traced if path in stated]:
        found.append(f"the page's order is not the step's: {[path for path, _ in traced]}")
    return found


def around_problems(paths: list[str], loaded: set[str], step: set[str]) -> list[str]:
    found = []
    for path in paths:
        if not os.path.exists(os.path.join(REPO_ROOT, path)):
            found.append(f"{path}: no such file")
        elif is_extra(module_of(path)):
            found.append(f"{path}: an extra, not core")
        elif module_of(path) not in loaded:
            found.append(f"{path}: not loaded by a default run")
        if path in step:
            found.append(f"{path}: in the step's table already")
    return found


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> dict:
    """tests/one_step_trace.py's record of a default run (a process of its own: it makes tf.functions eager)."""
    model_dir = tmp_path_factory.mktemp("one_step") / "run"
    result = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tests", "one_step_trace.py"), str(model_dir)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("TRACE "))[len("TRACE "):])


def test_the_step_table_is_what_a_default_step_runs(trace):
    text = open(PAGE).read()
    page = step_rows(text)
    assert not step_problems(page, trace["step"]), step_problems(page, trace["step"])
    lines = sum(last - first + 1 for _, ranges in page for first, last in ranges)
    assert stated_step_totals(text) == (len(page), lines), (len(page), lines)
    assert len(page) <= STEP_BOUND[0] and lines <= STEP_BOUND[1], (len(page), lines)
    assert not [path for path, _ in page if is_extra(module_of(path))]


def test_the_files_around_the_step_are_core_and_loaded(trace):
    text = open(PAGE).read()
    paths = around_rows(text)
    assert len(paths) >= 15, paths
    assert not around_problems(paths, set(trace["modules"]), {path for path, _ in step_rows(text)})
    assert re.search(rf"^## Around it.*\({len(paths)} files\)$", text, flags=re.M)


def test_the_checks_report_a_left_out_file_a_wrong_range_a_file_not_run_and_a_bad_row():
    page = step_rows("## The step\n| 1 | `tpu_utils/loop.py` | 1-9 | planted |\n"
                     "| 2 | `data/pipeline.py` | 5-6 | planted |\n")
    traced = [["tpu_utils/loop.py", [[1, 10]]], ["training/learning/step.py", [[3, 4]]]]
    found = step_problems(page, traced)
    assert len(found) == 3 and "the page says lines [[1, 9]]" in found[0] and "leaves it out" in found[1] and \
        "runs none of it" in found[2], found
    swapped = step_problems(page, [["data/pipeline.py", [[5, 6]]], ["tpu_utils/loop.py", [[1, 9]]]])
    assert len(swapped) == 1 and "order" in swapped[0], swapped
    bad = around_problems(["planted/no_such_file.py", "training/trainer.py", "data/pipeline.py"],
                          loaded={"train", "data.pipeline"}, step={"data/pipeline.py"})
    assert bad == ["planted/no_such_file.py: no such file", "training/trainer.py: not loaded by a default run",
                   "data/pipeline.py: in the step's table already"], bad
