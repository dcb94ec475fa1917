"""`python -m scripts.tpu_startup` (an extra): the TPU start-up decision (tpu_utils/tpu/startup.py, core) printed as
`export` lines for a shell, for a named accelerator type, with a faked installed libtpu."""

import os
import subprocess
import sys

from test_tpu_startup import fake_libtpu  # noqa: F401 - the fixture, shared with the core's start-up tests.

from helpers import REPO_ROOT


def test_the_command_line_prints_the_decision_as_exports(fake_libtpu):  # noqa: F811
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([fake_libtpu, REPO_ROOT])}
    result = subprocess.run([sys.executable, "-m", "scripts.tpu_startup", "--accelerator_type=v5p-8"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "export NEXT_PLUGGABLE_DEVICE_USE_C_API=true"
    assert "v5p (v5p-8), 4 chip(s), 4 replica(s), single host, PJRT" in result.stderr
