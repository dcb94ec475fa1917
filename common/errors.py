"""Error types that carry the process exit codes listed in docs/run_directory.md, "Exit codes".

`train.py` maps each one to its exit code; everything else is a bug and exits 1 with a traceback.

Why storage failures have a code of their own (6) rather than 1: a supervisor (scripts/tpu_vm.py, a Kubernetes
restart policy, a Slurm requeue) decides from the exit code alone whether a rerun can help. A storage failure is
worth a rerun (the storage comes back; the run resumes from its last checkpoint); a bug is not, and Python exits 1
for any uncaught exception, so 1 alone cannot tell the two apart without parsing the log.
"""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG_ERROR = 2
EXIT_INTERRUPTED = 3
EXIT_NON_FINITE_LOSS = 4
EXIT_PREFLIGHT_FAILED = 5
EXIT_STORAGE_FAILED = 6


def user_message(error: BaseException) -> str:
    """The error's message for an `error:` line: without the "In call to configurable ..." lines gin appends when
    the error was raised inside a configurable (they name gin's internals, not the setting to fix)."""
    return str(error).split("\n  In call to configurable")[0]


def shorten(text: str, limit: int) -> str:
    """`text` on one line, cut at a word boundary to at most `limit` characters (with ' ...' when cut): for quoting
    a library's long error text inside one of ours."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " ..."


class ConfigError(ValueError):
    """Bad input or configuration, detected before any training step (exit code 2).

    The message must name the bad value, say what was expected and how to fix it.
    """

    exit_code = EXIT_CONFIG_ERROR


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite (exit code 4); no checkpoint was written for that loop."""

    exit_code = EXIT_NON_FINITE_LOSS


class TrainingInterrupted(RuntimeError):
    """SIGTERM, SIGINT or SIGHUP arrived; a checkpoint at the last completed loop was saved (exit code 3)."""

    exit_code = EXIT_INTERRUPTED


class StorageError(RuntimeError):
    """The storage failed (model_dir or DATA_DIR unreachable, full, or the run lock lost): nothing was written after
    the run knew, and the checkpoints saved before are intact (exit code 6). A rerun resumes once it is fixed."""

    exit_code = EXIT_STORAGE_FAILED


class InputServiceError(RuntimeError):
    """A tf.data service of DATA_SERVICE did not answer, or sent a batch out of sequence (exit code 1, one line
    naming the service): any checkpoint saved before is intact; a rerun resumes once it answers."""

    exit_code = EXIT_FAILED
