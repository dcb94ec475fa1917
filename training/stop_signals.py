"""SIGTERM and SIGINT, honoured from process start to exit: a stop is requested, and the run stops at the next point
where nothing is lost.

train.py installs the handlers first thing (`honoured()`), before TensorFlow is imported. The first signal only
records the request (and logs it); the run then stops:
- before training (start-up, building, restoring): at the next check, without writing anything (exit 3);
- during training: at the next loop boundary, after a checkpoint (exit 3);
- during the final evaluation or export: once the final checkpoint is written (exit 3).
A second signal raises KeyboardInterrupt at once (train.py: "stopped by a second interrupt").
"""

import contextlib
import logging
import signal
import threading

from common.errors import TrainingInterrupted

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_state = {"depth": 0, "received": None, "previous": {}}


def _handler(signum, frame):
    del frame
    if _state["received"] is not None:
        raise KeyboardInterrupt
    _state["received"] = signum
    log.warning("%s received: stopping at the next point where nothing is lost (send it again to stop at once).",
                signal.Signals(signum).name)


@contextlib.contextmanager
def honoured():
    """Installs the handlers for the body (re-entrant; only in the main thread) and restores the previous ones."""
    main_thread = threading.current_thread() is threading.main_thread()
    install = _state["depth"] == 0 and main_thread
    if install:
        _state["received"] = None
        _state["previous"] = {signum: signal.signal(signum, _handler) for signum in _SIGNALS}
    elif main_thread:
        reclaim()
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        if install:
            for signum, previous in _state["previous"].items():
                signal.signal(signum, previous)
            _state["previous"] = {}


def reclaim() -> None:
    """Re-installs the handlers while they are meant to be in place.

    TensorFlow's MultiWorkerMirroredStrategy (its preemption notifier) installs a C++ SIGTERM handler of its own,
    which silently replaces Python's: call this after creating a strategy.
    """
    if _state["depth"] > 0 and threading.current_thread() is threading.main_thread():
        for signum in _SIGNALS:
            signal.signal(signum, _handler)


def requested() -> str | None:
    """The name of the signal that requested a stop ('SIGTERM'), or None."""
    return signal.Signals(_state["received"]).name if _state["received"] is not None else None


def stop_if_requested(where: str, outcome: str = "nothing was written") -> None:
    """Raises TrainingInterrupted (exit 3) if a stop was requested; `where`/`outcome` go into its message."""
    if requested():
        raise TrainingInterrupted(f"Stopped by {requested()} {where}; {outcome}. Rerun the same command to "
                                  "continue.")
