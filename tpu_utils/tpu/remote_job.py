"""A training job that runs detached on a TPU VM's worker 0 and survives the SSH connection that started it.

scripts/tpu_vm.py starts the job with one SSH command and returns; the job writes its log, its pid and, when it
ends, its exit code into `~/tpu-template/job/`. Later SSH commands poll: the exit code if written, whether the
process is alive, and the log bytes past what was already shown (`tail -c +OFFSET`). A dropped connection loses
nothing: the next poll continues from the same offset. These are the shell commands and the parser of their
output; pure functions, so the tests run the very same commands in a local shell.

Attempt N (0, 1, ... after restarts) uses job/N.sh (the script), job/N.log, job/N.pid (train.py's pid), job/N.exit.
"""

import dataclasses
import re
import shlex

JOB_DIR = "job"
_END_OF_SCRIPT = "END_OF_TPU_VM_JOB"
_HEADER = re.compile(rb"^@@tpu_vm exit=(-|-?\d+) alive=([01]) size=(\d+)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Poll:
    exit_code: int | None  # written by the job's wrapper when train.py ended
    alive: bool  # train.py's process still exists
    size: int  # the log's size when polled
    chunk: bytes  # log bytes from the offset asked for up to `size`


def start_command(remote_dir: str, attempt: int, environment: dict, train_command: str) -> str:
    """Writes the job's script, starts it detached (setsid nohup: no terminal, its own session) and prints its pid.

    The script exports `environment`, runs `train_command` and records its exit code atomically; if the script
    itself dies (the VM is preempted or rebooted), there is no exit code and polls find it not alive.
    """
    files = f"{JOB_DIR}/{attempt}"
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in environment.items())
    script = (f"{exports}{train_command} &\necho $! > {files}.pid\nwait $!\n"
              f"echo $? > {files}.exit.tmp && mv {files}.exit.tmp {files}.exit")
    return (f"cd ~/{remote_dir} || exit 1; mkdir -p {JOB_DIR}; rm -f {files}.exit {files}.pid\n"
            f"cat > {files}.sh <<'{_END_OF_SCRIPT}'\n{script}\n{_END_OF_SCRIPT}\n"
            f"setsid nohup bash {files}.sh > {files}.log 2>&1 < /dev/null &\n"
            f"for i in $(seq 100); do [ -s {files}.pid ] && break; sleep 0.1; done\n"
            f"echo \"@@tpu_vm started pid=$(cat {files}.pid 2>/dev/null)\"")


def poll_command(remote_dir: str, attempt: int, offset: int) -> str:
    """Prints a header line (exit code, alive, log size) and then the log bytes from `offset` to that size.

    The exit code is read before the size: once it exists the log is complete, so no byte is missed.
    """
    files = f"{attempt}"
    return (f"cd ~/{remote_dir}/{JOB_DIR} && code=$(cat {files}.exit 2>/dev/null || echo -); "
            f"pid=$(cat {files}.pid 2>/dev/null); "
            f"if [ -n \"$pid\" ] && kill -0 \"$pid\" 2>/dev/null; then alive=1; else alive=0; fi; "
            f"size=$(stat -c %s {files}.log 2>/dev/null || echo 0); "
            f"echo \"@@tpu_vm exit=$code alive=$alive size=$size\"; "
            f"tail -c +{offset + 1} {files}.log 2>/dev/null | head -c $((size - {offset}))")


def stop_command(remote_dir: str, attempt: int) -> str:
    """SIGTERM to train.py (it checkpoints at the next loop boundary and exits 3); the wrapper records the code."""
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
