"""TensorFlow's own start-up lines off by default, for every command: each entry point (train.py, python -m
tools.predict, tools.compare, training.replica_invariance, stage, bench/) calls `quiet_tensorflow()` before
TensorFlow is imported.

TensorFlow's C++ code logs to stderr below TF_CPP_MIN_LOG_LEVEL, which it reads once, when it loads: 0 everything
(oneDNN's "custom operations are on", the CPU-instruction notice, XLA's "Ignoring Assert operator", ...), 1 hides
INFO, 2 hides WARNING too, 3 hides ERROR too. The commands use 2: what they have to say, they print themselves, and a
C++ error still shows. A value already in the environment wins, so `TF_CPP_MIN_LOG_LEVEL=0 python train.py` shows
every line (docs/watch_a_run.md).
"""

import os

QUIET_LEVEL = "2"
# Every command's own progress lines: the time, then the message ("09:14:03 step 100/1000 ...").
PROGRESS_FORMAT, PROGRESS_TIME_FORMAT = "%(asctime)s %(message)s", "%H:%M:%S"


def quiet_tensorflow(environ=os.environ) -> str:
    """Sets TF_CPP_MIN_LOG_LEVEL to QUIET_LEVEL unless `environ` sets it; returns the level in force. Call it before
    TensorFlow is imported (afterwards it changes nothing)."""
    return environ.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_LEVEL)
