"""Says what a storage failure was (permission, not a directory, disk full, ...) in one line a user can act on.

TensorFlow's file errors (tf.errors.OpError, local or gs://) and Python's OSError carry the cause in different
shapes; `describe` turns either into "permission denied: <detail>" and the like, for the messages of
StorageError and ConfigError. `transient` says whether a failure is the storage's state (unreachable, rate limited,
full) rather than the input's (permission denied, not a directory): only the first is worth a retry or a rerun, so
it is a StorageError (exit 6) wherever it happens, and everything else stays a ConfigError (exit 2) or a bug.
"""

import errno
import os
import traceback

# Substrings of TensorFlow's messages (POSIX strerror texts, GCS status texts) -> the cause in plain words.
_CAUSES = (
    ("permission denied", "permission denied"),
    ("operation not permitted", "permission denied"),
    ("response code 403", "permission denied (403)"),
    ("read-only file system", "read-only file system"),
    ("not a directory", "not a directory"),
    ("is a directory", "is a directory"),
    ("no space left", "disk full"),
    ("disk quota exceeded", "disk quota exceeded"),
    ("file exists", "a file is in the way"),
    ("no such file or directory", "no such file or directory"),
    ("couldn't connect", "storage unreachable"),
    ("connection refused", "storage unreachable"),
    ("timed out", "storage timed out"),
    ("response code 503", "storage unavailable (503)"),
    # TensorFlow's GCS client after its retries ("All N retry attempts failed. The last failure: ... 429 ...").
    ("response code 429", "rate limited (429)"),
    ("response code 401", "credentials rejected (401): expired or revoked"),
    ("response code 500", "storage server error (500)"),
    ("response code 502", "storage server error (502)"),
    ("response code 504", "storage timed out (504)"),
    ("response code 408", "storage timed out (408)"),
    ("retry attempts failed", "storage unreachable"),
)
_HTTP_CAUSES = {401: "credentials rejected (401): expired or revoked", 403: "permission denied (403)",
                404: "not found (404)", 429: "rate limited (429)", 500: "storage server error (500)",
                502: "storage server error (502)", 503: "storage unavailable (503)", 504: "storage timed out (504)"}
_ERRNO_CAUSES = {errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                 errno.EROFS: "read-only file system", errno.ENOTDIR: "not a directory", errno.EISDIR: "is a directory",
                 errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EEXIST: "a file is in the way",
                 errno.ENOENT: "no such file or directory"}


def cause(error: BaseException) -> str | None:
    """'permission denied', 'disk full', ... or None when the error does not say."""
    if isinstance(error, OSError) and error.errno in _ERRNO_CAUSES:
        return _ERRNO_CAUSES[error.errno]
    if getattr(error, "code", None) in _HTTP_CAUSES:  # google-cloud-storage's exceptions carry the HTTP status.
        return _HTTP_CAUSES[error.code]
    text = (getattr(error, "message", None) or str(error)).lower()
    return next((plain for needle, plain in _CAUSES if needle in text), None)


def describe(error: BaseException, limit: int = 300) -> str:
    """'<cause>: <TensorFlow's or the OS's own words>', on one line."""
    detail = " ".join((getattr(error, "message", None) or str(error)).split())[:limit]
    found = cause(error)
    return f"{found}: {detail}" if found else f"{type(error).__name__}: {detail}"


# The storage did not answer, or cannot take more now; a retry or a rerun can succeed. By class name (each class in
# the error's MRO), so that this module needs neither TensorFlow nor the Google client libraries to be imported.
_TRANSIENT_CLASSES = frozenset({
    # TensorFlow (local files and gs://): its GCS client ends a failed retry series with AbortedError.
    "UnavailableError", "DeadlineExceededError", "AbortedError", "ResourceExhaustedError",
    # google-api-core (google-cloud-storage): HTTP 429 and 5xx, and its own retry deadline.
    "ServiceUnavailable", "TooManyRequests", "InternalServerError", "BadGateway", "GatewayTimeout", "DeadlineExceeded",
    "RetryError",
    # requests / urllib3 / google-auth: no connection at all.
    "ConnectionError", "Timeout", "ConnectTimeout", "ReadTimeout", "TransportError", "MaxRetryError",
    "NewConnectionError", "TimeoutError",
})
_TRANSIENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ETIMEDOUT, errno.ECONNREFUSED,
                               errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH})


def transient(error: BaseException) -> bool:
    """True when `error` is the storage's passing state (unreachable, timed out, rate limited, full), not the
    input's. An error raised from one (`raise ... from error`: TFDS's RuntimeError, our StorageError) counts too."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS:
            return True
        if any(cls.__name__ in _TRANSIENT_CLASSES for cls in type(error).__mro__):
            return True
        error = error.__cause__
    return False


def outage_message(error: BaseException, repo_root: str) -> str | None:
    """The `error:` line for a storage outage that no code of the run caught (TensorFlow's gs:// client, TFDS or
    google-cloud-storage, anywhere), or None when `error` is not one: then it is a bug (exit 1, traceback). Only an
    error that names a gs:// path or Google's storage API counts, so that a multi-worker job's collective or peer
    errors (also "unavailable") stay crashes."""
    text = getattr(error, "message", None) or str(error)
    if not transient(error) or not ("gs://" in text or "googleapis.com" in text):
        return None
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename.startswith(repo_root)]
    where = f"{os.path.relpath(frames[-1].filename, repo_root)}:{frames[-1].lineno}" if frames else "start-up"
    return (f"the storage did not answer ({describe(error)}; at {where}). Nothing was written after it; the "
            "checkpoints saved before are intact: rerun the same command once it answers.")
