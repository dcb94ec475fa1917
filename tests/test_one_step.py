"""docs/one_step.md stays true: every file it walks exists, has the line count the page states (and each section's
total), is core (not an extra: tests/test_layout.py's rule), and is loaded by a real default run. Negative
control: a planted row with a wrong count, an extra and a file the run does not load is reported three times."""

import os
import re
import subprocess
import sys

from helpers import REPO_ROOT
from test_layout import is_extra

PAGE = os.path.join(REPO_ROOT, "docs", "one_step.md")


def rows(text: str) -> list[tuple[str, int]]:
    return [(path, int(lines)) for path, lines in re.findall(r"^\| \d+ \| `([\w/.]+)` \| (\d+) \|", text, flags=re.M)]


def totals(text: str) -> list[tuple[int, int]]:
    return [(int(files), int(lines.replace(",", ""))) for files, lines in
            re.findall(r"^## .*\((\d+) files, ([\d,]+) lines\)$", text, flags=re.M)]


def module_of(path: str) -> str:
    return path[:-len(".py")].replace("/", ".")


def problems(walked: list[tuple[str, int]], loaded: set[str]) -> list[str]:
    found = []
    for path, stated in walked:
        full = os.path.join(REPO_ROOT, path)
        if not os.path.exists(full):
            found.append(f"{path}: no such file")
            continue
        actual = len(open(full).read().splitlines())
        if actual != stated:
            found.append(f"{path}: the page says {stated} lines, it has {actual}")
        if is_extra(module_of(path)):
            found.append(f"{path}: an extra, not core")
        if module_of(path) not in loaded:
            found.append(f"{path}: not loaded by a default run")
    return found


def default_run_modules(tmp_path) -> set[str]:
    """The first-party modules a default run (one loop) has loaded when it ends."""
    script = ("import sys, train; code = train.main(['train.py', '--model_dir=' + sys.argv[1], "
              "'--gin_param=TRAIN_STEPS=100', '--gin_param=EVAL_EVERY=0', '--gin_param=CHECKPOINT_EVERY=0']); "
              "print('MODULES', ' '.join(sorted(sys.modules))); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return set(next(line for line in result.stdout.splitlines() if line.startswith("MODULES ")).split()[1:])


def test_the_walk_through_is_true(tmp_path):
    text = open(PAGE).read()
    walked = rows(text)
    assert len(walked) >= 20, walked
    assert not problems(walked, default_run_modules(tmp_path)), problems(walked, default_run_modules(tmp_path))
    sections = [walked[:7], walked[7:]]
    stated = totals(text)
    assert stated == [(len(section), sum(lines for _, lines in section)) for section in sections], stated


def test_the_check_reports_a_wrong_count_an_extra_and_a_file_not_loaded():
    planted = rows("| 1 | `tools/compare.py` | 1 | planted |\n")
    found = problems(planted, loaded={"train"})
    assert len(found) == 3 and "the page says 1 lines" in found[0] and "an extra" in found[1] and \
        "not loaded" in found[2], found
