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


def test_a_bucket_that_does_not_answer_at_start_up_is_reported_with_the_seconds_really_waited(gcs_persistent):
    """The loopback GCS server stopped (connections refused), the start-up bucket check with a 6 s bound: its
    retries stop when the next back-off would cross the bound, before 6 s. The message states the time waited
    (within 0.5 s of what the test measured) and the bound apart. Control: the server back, the check passes."""
    import re

    import pytest

    from common.errors import StorageError
    from gcs.bucket_checks import check_gcs_paths

    gcs = gcs_persistent  # Its buckets survive the restart (the control below).
    model_dir = f"gs://{gcs.new_bucket()}/run"
    gcs.stop_server()
    try:
        started = time.monotonic()
        with pytest.raises(StorageError) as error:
            check_gcs_paths({"model_dir": model_dir}, timeout_seconds=6)
        elapsed = time.monotonic() - started
    finally:
        gcs.restart_server()
    message = str(error.value)
    print(message, f"(measured {elapsed:.2f} s)")
    said = re.search(r"did not answer in ([\d.]+) s of retries \(bounded by experiment.storage_timeout_seconds=6; ",
                     message)
    assert said, message
    assert abs(float(said.group(1)) - elapsed) <= 0.5 and elapsed < 6, (said.group(1), elapsed)
    check_gcs_paths({"model_dir": model_dir}, timeout_seconds=6)
