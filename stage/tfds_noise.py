"""Two lines TFDS prints while `store_as_tfds_dataset` writes a user's local data, which read as faults or downloads
to someone staging a CSV: the warning "Variant folder DIR/NAME/1.0.0 has no dataset_info.json" (the folder TFDS is
about to fill) and "Downloading and preparing dataset Unknown size (download: Unknown size, ...)" (nothing is
downloaded). `quiet_local_build()` drops exactly those two while it lasts; every other warning and line passes.
"""

import contextlib
import io
import logging
import sys

_WARNING = "Variant folder %s has no %s"  # TFDS's format string (tensorflow_datasets/core/utils/file_utils.py).
_PRINTED = "Downloading and preparing dataset "  # Printed to stdout by DatasetBuilder._log_download_bytes.


class _DropWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == _WARNING and "dataset_info.json" in record.getMessage())


class _DropLine(io.TextIOBase):
    """A stdout that passes everything to `target` but lines starting with _PRINTED."""

    def __init__(self, target):
        super().__init__()
        self.target, self.pending = target, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if _PRINTED not in line:
                self.target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.target.flush()


@contextlib.contextmanager
def quiet_local_build():
    """Drops the two TFDS lines of the module docstring (from the 'absl' logger and stdout) inside the block."""
    drop_warning, stdout = _DropWarning(), _DropLine(sys.stdout)
    logger = logging.getLogger("absl")  # Where absl.logging, which TFDS logs with, logs.
    logger.addFilter(drop_warning)
    try:
        with contextlib.redirect_stdout(stdout):
            yield
    finally:
        if stdout.pending and _PRINTED not in stdout.pending:
            stdout.target.write(stdout.pending)
        stdout.flush()
        logger.removeFilter(drop_warning)
