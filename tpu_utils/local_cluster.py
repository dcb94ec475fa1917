"""A multi-worker job on this machine: worker processes with TF_CONFIGs naming free 127.0.0.1 ports.

scripts/launch_local.py runs train.py this way; the tests use it too, and its free-port finder for their servers.
Worker 0 is the chief. Each worker's output is forwarded line by line with a `[worker N]` prefix.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_loopback_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (all held open until every one is picked)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tf_configs(num_workers: int) -> list[str]:
    """One TF_CONFIG per worker, all naming the same loopback cluster."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_loopback_ports(num_workers)]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            for index in range(num_workers)]


def _forward(stream, prefix: str, lock: threading.Lock) -> None:
    for line in iter(stream.readline, ""):
        with lock:
            sys.stdout.write(f"{prefix} {line}")
            sys.stdout.flush()
    stream.close()


class LocalJob:
    """The worker processes of one local job."""

    def __init__(self, command: list[str], num_workers: int, grace_seconds: float):
        """Starts `command` once per worker, each with its TF_CONFIG."""
        self.grace_seconds = grace_seconds
        self.processes = []
        self.threads = []
        lock = threading.Lock()
        for index, tf_config in enumerate(tf_configs(num_workers)):
            env = {**os.environ, "TF_CONFIG": tf_config, "PYTHONUNBUFFERED": "1"}
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       errors="replace")
            thread = threading.Thread(target=_forward, args=(process.stdout, f"[worker {index}]", lock), daemon=True)
            thread.start()
            self.processes.append(process)
            self.threads.append(thread)

    def wait(self) -> int:
        """Waits for every worker; on the first failure stops the rest. Returns the job's exit code."""
        failed = None
        while failed is None and any(process.poll() is None for process in self.processes):
            failed = next((index for index, process in enumerate(self.processes)
                           if process.returncode not in (None, 0)), None)
            time.sleep(0.1)
        if failed is None:
            failed = next((index for index, process in enumerate(self.processes) if process.returncode), None)
        if failed is not None:
            print(f"[launcher] worker {failed} exited with code {self.processes[failed].returncode}; stopping the "
                  "others.", flush=True)
            self.stop()
        for thread in self.threads:
            thread.join(timeout=5)
        if failed is None:
            return 0
        code = self.processes[failed].returncode
        return code if code > 0 else 128 - code  # Killed by signal N: 128 + N, as a shell reports it.

    def stop(self) -> None:
        """SIGTERM to every running worker, SIGKILL to those still running after the grace period."""
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
