"""Storage failures say what failed, and a slow storage wait prints a progress line at least every interval."""

import errno
import time

import tensorflow as tf

from common.storage_errors import cause, describe


def test_a_slow_storage_wait_prints_a_progress_line_every_interval(caplog):
    from common.storage_wait import reporting

    with reporting("gs://slow-bucket", every=0.2):
        time.sleep(0.7)
    lines = [record.getMessage() for record in caplog.records if "Still waiting for gs://slow-bucket" in
             record.getMessage()]
    assert 2 <= len(lines) <= 4, lines
    caplog.clear()
    with reporting("gs://fast-bucket", every=0.2):  # Negative control: a quick call says nothing.
        pass
    assert "Still waiting" not in caplog.text


def test_storage_errors_name_the_cause():
    assert cause(PermissionError(errno.EACCES, "Permission denied", "/x")) == "permission denied"
    assert cause(OSError(errno.ENOSPC, "No space left on device")) == "disk full"
    assert cause(tf.errors.FailedPreconditionError(None, None, "/run/a is Not a directory")) == "not a directory"
    assert describe(tf.errors.PermissionDeniedError(None, None, "Read-only file system")).startswith(
        "read-only file system: ")
    from google.api_core import exceptions

    assert cause(exceptions.Forbidden("denied")) == "permission denied (403)"
    assert cause(ValueError("ckpt-403.index: something else")) is None  # Negative control: no invented cause.
