"""SIGTERM, SIGINT and SIGHUP, honoured from process start to exit: a stop is requested, and the run stops at the next
point where nothing is lost.

train.py installs the handlers first thing (`honoured()`), before TensorFlow is imported. The first signal only
records the request (and logs it); the run then stops:
- before training (start-up, building, restoring): at the next check, without writing anything (exit 3);
- during training: at the next loop boundary, after a checkpoint (exit 3);
- during the final evaluation or export: once the final checkpoint is written (exit 3).
A second signal stops the process at once (exit 3), even while the main thread is inside a long on-device loop:
Python runs signal handlers only between bytecodes, so a watcher thread reads the signal numbers that the C-level
handler writes to a wakeup pipe, logs the first at once and ends the process on the second (checkpoints saved
before are intact; one being written is skipped on resume as damaged).

SIGHUP is what a terminal or SSH session that closes sends (without `nohup`): by default it ends Python at once, and
every step since the last checkpoint was lost. Here it is a SIGTERM: a checkpoint at the next loop boundary, exit 3.
Its terminal is gone by then and writing to it fails (EIO), which would crash the run before that checkpoint, so
stdout and stderr, if they were that terminal, are pointed at /dev/null. A SIGHUP ignored when the process started
(`nohup python train.py`, the TPU VM launcher's `setsid nohup`) stays ignored: the user asked to survive a hang-up.
"""

import contextlib
import logging
import os
import signal
import threading

from common.errors import TrainingInterrupted

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_INTERRUPTED = TrainingInterrupted.exit_code
# previous: the handlers replaced (and so restored at the end); terminals: the output fds that were a terminal then.
_state = {"depth": 0, "received": None, "previous": {}, "seen": 0, "watcher": None, "terminals": ()}


def _handler(signum, frame):
    del frame
    if signum == signal.SIGHUP:
        discard_output_if_hung_up(_state["terminals"])
    if _state["received"] is not None:
        raise KeyboardInterrupt
    _state["received"] = signum
    if _state["watcher"] is None:  # Else the watcher thread logged it when it arrived.
        _log_first(signum)


def _log_first(signum) -> None:
    log.warning("%s received: stopping at the next point where nothing is lost (send it again to stop at once).",
                signal.Signals(signum).name)


def _watch(read_fd: int) -> None:
    """Runs in a daemon thread: sees each signal as it arrives, whatever the main thread is doing."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum not in _SIGNALS or _state["depth"] == 0:
                continue
            if signum == signal.SIGHUP:  # Before logging: the log may be the terminal that hung up.
                discard_output_if_hung_up(_state["terminals"])
            _state["seen"] += 1
            if _state["seen"] == 1:
                _log_first(signum)
            else:
                log.error("%s received again: stopping at once. Checkpoints saved before are intact; rerun the same "
                          "command to resume.", signal.Signals(signum).name)
                logging.shutdown()
                os._exit(EXIT_INTERRUPTED)


def _start_watcher() -> None:
    """A wakeup pipe for the C-level signal handler and the thread that reads it (once per process)."""
    if _state["watcher"] is not None:
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    _state["watcher"] = threading.Thread(target=_watch, args=(read_fd,), name="stop-signal-watcher", daemon=True)
    _state["watcher"].start()


@contextlib.contextmanager
def honoured():
    """Installs the handlers for the body (re-entrant; only in the main thread) and restores the previous ones."""
    main_thread = threading.current_thread() is threading.main_thread()
    install = _state["depth"] == 0 and main_thread
    if install:
        _state["received"] = None
        _state["seen"] = 0
        _state["terminals"] = tuple(fd for fd in (1, 2) if os.isatty(fd))
        _state["previous"] = {signum: signal.signal(signum, _handler) for signum in _SIGNALS
                              if not (signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN)}
        _start_watcher()
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
        for signum in _state["previous"]:  # Those installed: an ignored SIGHUP stays ignored.
            signal.signal(signum, _handler)


def discard_output_if_hung_up(terminals: tuple[int, ...]) -> None:
    """Points each of the file descriptors `terminals` (that were a terminal) at /dev/null if its terminal has hung
    up: writes to it would fail with EIO from now on (os.isatty is then False), and the run must still reach its
    checkpoint and print its last lines without an error."""
    lost = [fd for fd in terminals if not os.isatty(fd)]
    if lost:
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in lost:
            os.dup2(null, fd)
        os.close(null)


def requested() -> str | None:
    """The name of the signal that requested a stop ('SIGTERM'), or None."""
    return signal.Signals(_state["received"]).name if _state["received"] is not None else None


def stop_if_requested(where: str, outcome: str = "nothing was written") -> None:
    """Raises TrainingInterrupted (exit 3) if a stop was requested; `where`/`outcome` go into its message."""
    if requested():
        raise TrainingInterrupted(f"Stopped by {requested()} {where}; {outcome}. Rerun the same command to "
                                  "continue.")
