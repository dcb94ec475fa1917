"""A multi-worker job on this machine: worker processes with TF_CONFIGs naming free 127.0.0.1 ports.

scripts/launch_local.py runs train.py this way; the tests use it too.
Worker 0 is the chief. Each worker's output is forwarded line by line with a `[worker N]` prefix.

Signals: the workers run in their own session, so a terminal's Ctrl-C (SIGINT to the foreground process group) or
hang-up (SIGHUP) reaches the launcher only, which passes one SIGTERM to each worker (`request_stop`): they stop
together at their next loop boundary, after a checkpoint. (Were they in the launcher's group, each would get the
terminal's SIGINT and the forwarded SIGTERM, count two signals and stop at once, without that checkpoint.) A launcher
killed outright (SIGKILL) passes nothing on: its workers train on to the end, their output lost; stop them with
`kill -TERM <pid>`.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

from common.loopback import free_loopback_ports


def tf_configs(num_workers: int) -> list[str]:
    """One TF_CONFIG per worker, all naming the same loopback cluster."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_loopback_ports(num_workers)]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            for index in range(num_workers)]


def _forward(stream, prefix: str, lock: threading.Lock) -> None:
    """Copies a worker's output lines to stdout until the worker closes it. If stdout fails (a closed pipe), the lines
    are read and dropped: a worker whose output is not read would block once the pipe is full, short of its
    checkpoint."""
    for line in iter(stream.readline, ""):
        with lock:
            try:
                sys.stdout.write(f"{prefix} {line}")
                sys.stdout.flush()
            except (OSError, ValueError):
                pass
    stream.close()


class LocalJob:
    """The worker processes of one local job."""

    def __init__(self, command: list[str], num_workers: int, grace_seconds: float):
        """Starts `command` once per worker, each with its TF_CONFIG, in a session of its own."""
        self.grace_seconds = grace_seconds
        self.stop_requests = 0
        self.processes = []
        self.threads = []
        lock = threading.Lock()
        for index, tf_config in enumerate(tf_configs(num_workers)):
            env = {**os.environ, "TF_CONFIG": tf_config, "PYTHONUNBUFFERED": "1"}
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       errors="replace", start_new_session=True)
            thread = threading.Thread(target=_forward, args=(process.stdout, f"[worker {index}]", lock), daemon=True)
            thread.start()
            self.processes.append(process)
            self.threads.append(thread)

    def wait(self) -> int:
        """Waits for every worker and returns the job's exit code. A worker that fails on its own stops the rest
        (`stop`); after `request_stop` the workers are left to stop together (each exits 3)."""
        failed = None
        while failed is None and any(process.poll() is None for process in self.processes):
            if not self.stop_requests:
                failed = next((index for index, process in enumerate(self.processes)
                               if process.returncode not in (None, 0)), None)
            time.sleep(0.1)
        if failed is not None:
            print(f"[launcher] worker {failed} exited with code {self.processes[failed].returncode}; stopping the "
                  "others.", flush=True)
            self.stop()
        for process in self.processes:
            process.wait()
        for thread in self.threads:
            thread.join(timeout=5)
        if failed is None:
            failed = next((index for index, process in enumerate(self.processes) if process.returncode), None)
        if failed is None:
            return 0
        code = self.processes[failed].returncode
        return code if code > 0 else 128 - code  # Killed by signal N: 128 + N, as a shell reports it.

    def request_stop(self) -> None:
        """A stop asked for by the user: SIGTERM to every running worker (a second request: they stop at once)."""
        self.stop_requests += 1
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM to every running worker, SIGKILL to those still running after the grace period (a worker blocked
        in a collective with a failed peer never reaches its next loop boundary)."""
        running = [process for process in self.processes if process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

