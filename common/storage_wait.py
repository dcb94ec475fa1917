"""A progress line at least every 10 s while waiting for storage, so a slow or unreachable bucket never looks hung.

google-cloud-storage retries a refused or unanswered connection for up to two minutes; without a word the run
looks dead. `reporting(what)` logs "still waiting for <what>" every PROGRESS_SECONDS from a background thread.
(A thread runs only while the waiting call releases the GIL: google-cloud-storage's sockets do; some of
TensorFlow's own gs:// calls hold it, and then the line comes late.)
"""

import contextlib
import logging
import threading
import time

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 10.0


@contextlib.contextmanager
def reporting(what: str, every: float = PROGRESS_SECONDS, *, cause: str = "the storage is slow or unreachable"):
    """Runs the body; logs a progress line every `every` seconds until it returns. Yields `waited()`, the seconds
    since the body began, so that a message about the wait states the real time, not a bound. `cause`: what the
    line says the wait means."""
    done = threading.Event()
    started = time.monotonic()

    def waited() -> float:
        return time.monotonic() - started

    def report():
        while not done.wait(every):
            log.warning("Still waiting for %s (%.0f s so far): %s.", what, waited(), cause)

    thread = threading.Thread(target=report, name="storage-progress", daemon=True)
    thread.start()
    try:
        yield waited
    finally:
        done.set()
        thread.join(timeout=1)


def reporting_on_gcs(what: str, path: str, every: float = PROGRESS_SECONDS):
    """`reporting(what)` for a gs:// `path`; nothing for a local one (a local write does not wait on a network: it
    yields None)."""
    return reporting(what, every) if path.startswith("gs://") else contextlib.nullcontext()
