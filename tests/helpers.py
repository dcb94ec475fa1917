"""Helpers shared by tests (fixtures live in conftest.py)."""

import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_train_py(*args: str, cwd: str | None = None, timeout: float = 300, env: dict | None = None):
    """Runs `python train.py ARGS` in a subprocess; returns the CompletedProcess (stdout and stderr as text)."""
    return subprocess.run([sys.executable, os.path.join(REPO_ROOT, "train.py"), *args], cwd=cwd or REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def run_module(module: str, *args: str, timeout: float = 300):
    """Runs `python -m MODULE ARGS` from the repository root; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))
