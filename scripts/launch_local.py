"""Runs a multi-worker job on this machine, to try MultiWorkerMirroredStrategy before renting several machines.

  python scripts/launch_local.py --workers 2 -- --gin_file=configs/experiments/digits_mlp.gin --model_dir=runs/mw

Starts WORKERS processes of `train.py ARGS --gin_param=STRATEGY='multi_worker_mirrored'`, each with its own TF_CONFIG
on free 127.0.0.1 ports (worker 0 is the chief), and forwards their output line by line with a `[worker N]` prefix.
When a worker fails, the others are stopped (SIGTERM, then SIGKILL after --grace_seconds) and the launcher exits with
that worker's exit code. Ctrl-C (SIGINT), SIGTERM or SIGHUP (its terminal or SSH session closed) to the launcher is
passed on as one SIGTERM per worker: they stop together after a checkpoint and the launcher exits 3; a second one
stops them at once. After a hang-up the launcher's output, if it was the closed terminal, goes to /dev/null; started
with SIGHUP ignored (`nohup`), it ignores it. A launcher killed outright (SIGKILL) passes nothing on: its workers
train on to the end; stop them with `kill -TERM <pid>`. A worker whose peer never starts exits on its own after
experiment.startup_timeout_seconds.
"""

import argparse
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # Run as a script from anywhere.

from scripts.local_cluster import LocalJob  # noqa: E402
from training.stop_signals import discard_output_if_hung_up  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGY_PARAM = "--gin_param=STRATEGY='multi_worker_mirrored'"


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
    terminals = tuple(fd for fd in (1, 2) if os.isatty(fd))
    job = LocalJob(command, args.workers, args.grace_seconds)

    def forward_signal(signum, frame):
        if signum == signal.SIGHUP:  # Before printing: the terminal may be gone.
            discard_output_if_hung_up(terminals)
        if job.stop_requests:
            print(f"[launcher] {signal.Signals(signum).name} again: the workers stop at once.", flush=True)
        else:
            print(f"[launcher] {signal.Signals(signum).name}: the workers stop at their next loop boundary, after a "
                  "checkpoint (send it again to stop them at once).", flush=True)
        job.request_stop()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if not (signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN):  # nohup: stays ignored.
            signal.signal(signum, forward_signal)
    return job.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
