"""A hard time limit for set-up calls that can block forever inside TensorFlow's C++ code.

MultiWorkerMirroredStrategy's constructor waits without end for a worker that never starts, and connecting to a TPU
at an unreachable grpc:// address waits for minutes; both hold the GIL, so a Python timer or signal handler never
runs. `faulthandler`'s watchdog is a C thread that needs no GIL: when the limit passes it prints every thread's
stack to stderr (showing what was being waited for) and ends the process with exit status 1.
"""

import contextlib
import faulthandler
import logging

log = logging.getLogger(__name__)


@contextlib.contextmanager
def exit_if_stuck(seconds: float, waiting_for: str, fix: str):
    """Runs the body; if it takes longer than `seconds`, the process exits with status 1.

    `waiting_for` and `fix` are logged up front, since nothing in Python can run once the limit passes.
    """
    log.info("Waiting for %s; after %d s this process exits with a 'Timeout' stack dump. %s", waiting_for, seconds,
             fix)
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
