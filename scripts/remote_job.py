"""A training job that runs detached on a TPU VM's worker 0 and survives the SSH connection that started it.

scripts/tpu_vm.py starts the job with one SSH command and returns; the job writes its log, its pid and, when it
ends, its exit code into `~/tpu-template/job/`. Later SSH commands poll: the exit code if written, whether the
process is alive, and the log bytes past what was already shown (`tail -c +OFFSET`). A dropped connection loses
nothing: the next poll continues from the same offset. These are the shell commands and the parser of their
output; pure functions, so the tests run the very same commands in a local shell. Nothing a user passes is
ever shell text here: the job's script travels base64-encoded, and its arguments are quoted inside it.

Attempt N (0, 1, ... after restarts) uses job/N.sh (the script), job/N.log, job/N.pid (train.py's pid), job/N.exit.
"""

import base64
import dataclasses
import re
import shlex

JOB_DIR = "job"
_REMOTE_DIR = re.compile(r"[A-Za-z0-9._-]+")  # A folder in the home directory: nothing the shell expands.
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# One argument of a command line on Linux is at most 128 KiB (MAX_ARG_STRLEN), here (gcloud's ssh) and on the VM
# (bash -c): the start command, the job's script base64-encoded, must fit, with room to spare.
MAX_START_COMMAND_BYTES = 100_000
_HEADER = re.compile(rb"^@@tpu_vm exit=(-|-?\d+) alive=([01]) size=(\d+)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Poll:
    exit_code: int | None  # written by the job's wrapper when train.py ended
    alive: bool  # train.py's process still exists
    size: int  # the log's size when polled
    chunk: bytes  # log bytes from the offset asked for up to `size`


def job_script(attempt: int, environment: dict, argv: list[str]) -> str:
    """The job's bash script: exports `environment`, runs `argv` (each word quoted: no argument is shell syntax) in
    the background, records its pid, waits, and records its exit code atomically."""
    _check_attempt(attempt)
    for key in environment:
        if not _VARIABLE.fullmatch(key):
            raise ValueError(f"environment variable name {key!r}: expected letters, digits and _ (not first a digit)")
    files = f"{JOB_DIR}/{attempt}"
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in environment.items())
    return (f"{exports}{shlex.join(argv)} &\necho $! > {files}.pid\nwait $!\n"
            f"echo $? > {files}.exit.tmp && mv {files}.exit.tmp {files}.exit\n")


def start_command(remote_dir: str, attempt: int, environment: dict, argv: list[str]) -> str:
    """Writes the job's script (`job_script`), starts it detached (setsid nohup: no terminal, its own session) and
    prints its pid. If the script itself dies (the VM is preempted or rebooted), there is no exit code and polls
    find it not alive.

    The script travels base64-encoded (letters, digits, + / =), decoded on the VM by `base64 -d`: whatever the
    arguments hold (newlines, quotes, `$(...)`, a line that would end a heredoc, bytes that are not UTF-8), none of
    it reaches the remote shell as text it would read. Non-UTF-8 bytes in an argument (Python's surrogateescape)
    reach train.py as the same bytes. Raises ValueError if the command would be too long for one SSH command.
    """
    _check_remote_dir(remote_dir)
    files = f"{JOB_DIR}/{attempt}"
    script = job_script(attempt, environment, argv).encode("utf-8", "surrogateescape")
    encoded = base64.b64encode(script).decode("ascii")
    if len(encoded) > MAX_START_COMMAND_BYTES - 1000:  # The rest of the command is under 1000 bytes.
        raise ValueError(f"the train.py arguments make a job script of {len(script)} bytes, {len(encoded)} "
                         f"base64-encoded, over the {MAX_START_COMMAND_BYTES - 1000} one SSH command carries: put the "
                         "settings in a gin file (--gin_file=FILE; it is sent with the code if git tracks it, or "
                         "with --include=FILE).")
    return (f"cd ~/{remote_dir} || exit 1; mkdir -p {JOB_DIR}; rm -f {files}.exit {files}.pid\n"
            f"echo {encoded} | base64 -d > {files}.sh || exit 1\n"
            f"setsid nohup bash {files}.sh > {files}.log 2>&1 < /dev/null &\n"
            f"for i in $(seq 100); do [ -s {files}.pid ] && break; sleep 0.1; done\n"
            f"echo \"@@tpu_vm started pid=$(cat {files}.pid 2>/dev/null)\"")


def poll_command(remote_dir: str, attempt: int, offset: int) -> str:
    """Prints a header line (exit code, alive, log size) and then the log bytes from `offset` to that size.

    The exit code is read before the size: once it exists the log is complete, so no byte is missed.
    """
    _check_remote_dir(remote_dir)
    _check_attempt(attempt)
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"log offset {offset!r}: expected an integer >= 0")
    files = f"{attempt}"
    return (f"cd ~/{remote_dir}/{JOB_DIR} && code=$(cat {files}.exit 2>/dev/null || echo -); "
            f"pid=$(cat {files}.pid 2>/dev/null); "
            f"if [ -n \"$pid\" ] && kill -0 \"$pid\" 2>/dev/null; then alive=1; else alive=0; fi; "
            f"size=$(stat -c %s {files}.log 2>/dev/null || echo 0); "
            f"echo \"@@tpu_vm exit=$code alive=$alive size=$size\"; "
            f"tail -c +{offset + 1} {files}.log 2>/dev/null | head -c $((size - {offset}))")


def stop_command(remote_dir: str, attempt: int) -> str:
    """SIGTERM to train.py (it checkpoints at the next loop boundary and exits 3); the wrapper records the code."""
    _check_remote_dir(remote_dir)
    _check_attempt(attempt)
    return f"cd ~/{remote_dir}/{JOB_DIR} && kill -TERM $(cat {attempt}.pid) 2>/dev/null; true"


def parse_poll(stdout: bytes, offset: int) -> Poll | None:
    """The poll's answer, or None if the output has no header (the SSH command did not reach the VM)."""
    match = _HEADER.search(stdout)
    if match is None:
        return None
    exit_text, alive, size = match.groups()
    start = match.end() + 1  # The header's newline.
    chunk = stdout[start:start + max(0, int(size) - offset)]
    return Poll(None if exit_text == b"-" else int(exit_text), alive == b"1", int(size), chunk)


def started_pid(stdout: str) -> int | None:
    """The pid printed by `start_command`, or None if the job did not start."""
    match = re.search(r"@@tpu_vm started pid=(\d+)", stdout)
    return int(match.group(1)) if match else None


def _check_remote_dir(remote_dir: str) -> None:
    if not _REMOTE_DIR.fullmatch(remote_dir) or remote_dir in (".", ".."):
        raise ValueError(f"remote folder {remote_dir!r}: expected one folder name (letters, digits, . _ -)")


def _check_attempt(attempt: int) -> None:
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        raise ValueError(f"attempt {attempt!r}: expected an integer >= 0")
