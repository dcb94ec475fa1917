"""TensorFlow's C++ start-up lines (oneDNN, CPU instructions, XLA's "Ignoring Assert operator", ...) are off in every
command by default, set in one place (common/tf_logging.py) before TensorFlow loads; an explicit TF_CPP_MIN_LOG_LEVEL
shows them. The point is a fresh process's stderr, so the command runs as a process: train.py --preflight (~10 s),
once quiet and once with TF_CPP_MIN_LOG_LEVEL=0 (the negative control: the pattern does find those lines)."""

import glob
import os
import re
import subprocess
import sys

from common.tf_logging import QUIET_LEVEL, quiet_tensorflow
from helpers import REPO_ROOT

# TensorFlow's C++ log lines ("2026-12-04 16:18:44.836515: W tensorflow/...") and absl's ("I0000 00:00:... ").
TF_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |[IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: All log "
                     r"messages before absl)")


def _preflight(model_dir, **environment) -> subprocess.CompletedProcess:
    """`python train.py --preflight` in a fresh process whose environment has no TF_CPP_MIN_LOG_LEVEL but
    `environment`'s (conftest sets one for the test process)."""
    env = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "train.py", "--preflight", f"--model_dir={model_dir}"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, env={**env, **environment})


def test_a_fresh_command_prints_no_tensorflow_start_up_lines_unless_asked(tmp_path, data_dir):
    quiet = _preflight(tmp_path / "quiet")
    assert quiet.returncode == 0, quiet.stdout[-2000:] + quiet.stderr[-2000:]
    assert "preflight passed." in quiet.stdout
    noise = [line for line in (quiet.stdout + quiet.stderr).splitlines() if TF_LINE.match(line)]
    assert not noise, noise
    shown = _preflight(tmp_path / "shown", TF_CPP_MIN_LOG_LEVEL="0")
    assert shown.returncode == 0, shown.stderr[-2000:]
    lines = [line for line in shown.stderr.splitlines() if TF_LINE.match(line)]
    print("\n".join(lines))
    assert lines, shown.stderr[-2000:]  # The opt-in shows them: the pattern above finds what it must not.


def test_an_explicit_level_wins():
    assert quiet_tensorflow({}) == QUIET_LEVEL == "2"
    assert quiet_tensorflow({"TF_CPP_MIN_LOG_LEVEL": "0"}) == "0"


def test_every_entry_point_asks_the_one_place():
    """Each command that loads TensorFlow calls quiet_tensorflow(); none sets the level itself."""
    entry_points = ["train.py", "tools/compare.py", "tools/predict.py", "training/replica_invariance.py",
                    "stage/cli.py", *sorted(os.path.relpath(path, REPO_ROOT) for path in
                                                 glob.glob(os.path.join(REPO_ROOT, "bench", "*.py")))]
    for path in entry_points:
        text = open(os.path.join(REPO_ROOT, path), encoding="utf-8").read()
        if path.startswith("bench/") and "tensorflow" not in text and "training" not in text:
            continue
        assert "quiet_tensorflow()" in text, path
        assert 'setdefault("TF_CPP_MIN_LOG_LEVEL"' not in text, path
