"""Train, evaluate or export one gin-configured experiment.

  python train.py                                    # configs/default.gin: the offline digits experiment
  python train.py --gin_file=configs/experiments/mnist_cnn.gin --gin_param="TRAIN_STEPS=500"
  python train.py --model_dir=runs/default --mode=eval

  python train.py --gin_file=configs/tpu/cifar10_resnet_v3_8.gin --preflight   # check a TPU config on CPU

Exit codes: 0 done, 2 bad input or config, 3 interrupted (checkpoint saved), 4 non-finite loss, 5 preflight failed,
6 storage failed (rerun once it is back), 1 a bug (see docs/run_directory.md, "Exit codes").
"""

import argparse
import atexit
import logging
import os
import shlex
import sys
import threading

from training.config_files import DEFAULT_GIN_FILE, REPO_ROOT  # gin only: TensorFlow is not loaded here.


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gin_file", action="append", default=None,
                        help=f"gin config file (repeatable, applied in order); default {DEFAULT_GIN_FILE}")
    parser.add_argument("--gin_param", action="append", default=[],
                        help='gin binding applied after the files, e.g. "TRAIN_STEPS=500" (repeatable)')
    parser.add_argument("--model_dir", default=None,
                        help="run directory, local or gs://; default runs/<experiment name> (rerunning resumes)")
    parser.add_argument("--mode", choices=("train", "eval", "export", "continuous_eval"), default="train",
                        help="continuous_eval: a sidecar evaluating each new checkpoint of a training job's model_dir "
                             "once (docs/sidecar_eval.md)")
    parser.add_argument("--preflight", action="store_true",
                        help="check the config on this CPU (for TPU configs: at their replica count, with an XLA "
                             "compile) without training; exit 0 if it passes, 5 if not")
    return parser.parse_args(argv)


def experiment_name(gin_files: list[str]) -> str:
    """The last gin file's name without extension: configs/experiments/mnist_cnn.gin -> mnist_cnn."""
    return os.path.splitext(os.path.basename(gin_files[-1]))[0]


def main(argv: list[str]) -> int:
    """Runs the command line `argv`; returns the exit code (docs/run_directory.md, "Exit codes")."""
    from training import stop_signals  # Standard library only: SIGTERM/SIGINT/SIGHUP are honoured from here on.

    with stop_signals.honoured():
        return _main(argv)


def _main(argv: list[str]) -> int:
    args = parse_args(argv[1:])
    # Before TensorFlow loads: keep its C++ start-up lines off a newcomer's first screen (common/tf_logging.py;
    # TF_CPP_MIN_LOG_LEVEL=0 shows them), and let its gs:// client give up on a failing request in ~20 s rather than
    # ~3 minutes (common/gcs_retries.py).
    from common import gcs_retries
    from common.tf_logging import PROGRESS_FORMAT, PROGRESS_TIME_FORMAT, quiet_tensorflow

    quiet_tensorflow()

    gcs_retries.set_defaults()
    logging.basicConfig(level=logging.WARNING, format=PROGRESS_FORMAT, datefmt=PROGRESS_TIME_FORMAT, stream=sys.stdout)
    for package in ("training", "tpu_utils", "data", "models", "tasks"):  # Our progress lines; libraries: WARNING.
        logging.getLogger(package).setLevel(logging.INFO)
    if not args.preflight:  # On a TPU, before TensorFlow loads: PJRT on v5e and later (tpu_utils/tpu/startup.py).
        from tpu_utils.tpu.startup import prepare_tpu_environment

        prepare_tpu_environment()

    from common.errors import (
        EXIT_PREFLIGHT_FAILED,
        ConfigError,
        InputServiceError,
        NonFiniteLossError,
        StorageError,
        TrainingInterrupted,
        user_message,
    )
    from common.storage_errors import outage_message
    from training import config_files

    gin_files = args.gin_file or [DEFAULT_GIN_FILE]
    model_dir = args.model_dir or os.path.join("runs", experiment_name(gin_files))
    try:
        if args.model_dir is not None and not args.model_dir.strip():
            raise ConfigError(f"--model_dir={args.model_dir!r} is empty (an unset variable in a script?); pass a run "
                              f"directory, e.g. --model_dir=runs/mine, or leave the flag out for {model_dir}.")
        config_files.parse(gin_files, args.gin_param, search_path=REPO_ROOT)
        from training import experiment

        print(f"model_dir: {model_dir}", flush=True)
        if args.preflight:
            return 0 if experiment.preflight(model_dir=model_dir) else EXIT_PREFLIGHT_FAILED
        result = experiment.run(model_dir=model_dir, mode=args.mode, command=shlex.join(argv))
    except (ConfigError, InputServiceError, NonFiniteLossError, StorageError,
            TrainingInterrupted) as error:
        print(f"error: {user_message(error)}", file=sys.stderr, flush=True)
        return error.exit_code
    except KeyboardInterrupt:
        print("error: stopped by a second interrupt, before the current step's checkpoint was written; the "
              "checkpoints saved before are intact.", file=sys.stderr, flush=True)
        return TrainingInterrupted.exit_code
    except Exception as error:  # noqa: BLE001 - only a storage outage is answered here; anything else is a bug.
        message = outage_message(error, REPO_ROOT)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr, flush=True)
        return StorageError.exit_code
    print(f"final: {result}", flush=True)
    return 0


TEARDOWN_SECONDS = 30  # A worker's exit handlers get this long; then the process ends anyway, with its exit code.


def exit_process(code: int) -> None:
    """Ends the process with `code`. A worker of a multi-worker job (TF_CONFIG set) ends in bounded time: a worker
    was seen hanging in the interpreter's teardown after its last checkpoint (not reproduced: once in four stops of
    a 10-minute two-worker run), so its exit handlers (e.g. AutoGraph's temporary files) run in a thread for at most
    TEARDOWN_SECONDS, and the process then ends without waiting on anything else. Every file is written by now.
    A run ended by a storage failure (exit 6) ends the same way: the interpreter's teardown would destroy its
    TensorBoard writers, and each flushes into the failing storage (minutes of TensorFlow's retries each), or into
    a model_dir whose lock this run has lost."""
    from common.errors import EXIT_STORAGE_FAILED

    if not os.environ.get("TF_CONFIG") and code != EXIT_STORAGE_FAILED:
        sys.exit(code)
    teardown = threading.Thread(target=atexit._run_exitfuncs, name="exit-handlers", daemon=True)
    teardown.start()
    teardown.join(TEARDOWN_SECONDS)
    if teardown.is_alive():
        print(f"warning: exit handlers still running after {TEARDOWN_SECONDS} s; exiting without them.",
              file=sys.stderr)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_process(main(sys.argv))
