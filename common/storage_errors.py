"""Says what a storage failure was (permission, not a directory, disk full, ...) in one line a user can act on.

TensorFlow's file errors (tf.errors.OpError, local or gs://) and Python's OSError carry the cause in different
shapes; `describe` turns either into "permission denied: <detail>" and the like, for the messages of
StorageError and ConfigError.
"""

import errno

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
