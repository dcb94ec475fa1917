"""Runs a multi-worker job on this machine, to try MultiWorkerMirroredStrategy before renting several machines.

  python -m tpu_utils.launch_local --workers 2 -- --gin_file=configs/experiments/digits_mlp.gin --model_dir=runs/mw

Starts WORKERS processes of `train.py ARGS --gin_param=STRATEGY='multi_worker_mirrored'`, each with its own TF_CONFIG
on free 127.0.0.1 ports (worker 0 is the chief), and forwards their output line by line with a `[worker N]` prefix.
When a worker fails, the others are stopped (SIGTERM, then SIGKILL after --grace_seconds) and the launcher exits with
that worker's exit code; SIGINT/SIGTERM to the launcher is passed on the same way. A worker whose peer never starts
exits on its own after experiment.startup_timeout_seconds.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGY_PARAM = "--gin_param=STRATEGY='multi_worker_mirrored'"


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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="number of worker processes (>= 1)")
    parser.add_argument("--grace_seconds", type=float, default=10.0,
                        help="after SIGTERM, how long a worker may take to stop before SIGKILL")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the arguments of train.py")
    args = parser.parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    if args.workers < 1:
        parser.error(f"--workers={args.workers} must be >= 1.")
    command = [sys.executable, os.path.join(REPO_ROOT, "train.py"), *train_args, STRATEGY_PARAM]
    job = LocalJob(command, args.workers, args.grace_seconds)

    def forward_signal(signum, frame):
        print(f"[launcher] {signal.Signals(signum).name}: stopping the workers.", flush=True)
        threading.Thread(target=job.stop, daemon=True).start()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward_signal)
    return job.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
