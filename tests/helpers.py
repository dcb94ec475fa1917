"""Helpers shared by tests (fixtures live in conftest.py)."""

import os
import signal
import subprocess
import sys
import threading
import time

import forked_python
from forked_python import REPO_ROOT  # One spelling of the repository's root for the tests.


def run_train_py(*args: str, cwd: str | None = None, timeout: float = 300, env: dict | None = None,
                 process: bool = False) -> subprocess.CompletedProcess:
    """Runs train.py's command line ARGS; returns a CompletedProcess (returncode, stdout and stderr as text).

    In this process by default (`train.main`, what `python train.py` calls): a process costs 5-8 s of interpreter and
    TensorFlow start-up before any work, and most tests need the command's behaviour, not a process. A separate
    process (`process=True`, or `env` given: variables TensorFlow reads once, when it loads) where the process is the
    point: a fresh interpreter's imports, TensorFlow's C++ output on the real stderr, the exit path. `timeout` bounds
    a process only.
    """
    if process or env:
        return forked_python.run([os.path.join(REPO_ROOT, "train.py"), *args], cwd=cwd or REPO_ROOT,
                                 capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return train_in_process(*args, cwd=cwd)


def train_in_process(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    """`python train.py ARGS` as this process's call of `train.main` (call_in_process says what a test gets)."""
    import train

    argv = [os.path.join(REPO_ROOT, "train.py"), *args]
    return call_in_process(train.main, argv, argv, cwd=cwd)


def call_in_process(entry, entry_argv: list[str], argv: list[str], cwd: str | None = None
                    ) -> subprocess.CompletedProcess:
    """`entry(entry_argv)`, a command's main function, with what a process would give a test: the working directory
    `cwd` (default the repository root), stdout and stderr captured (progress lines formatted as the commands format
    them), the environment and working directory restored after, Keras' global names reset before (a fresh
    process's layer names), an uncaught exception printed as a traceback with exit code 1. `argv` is the command
    line the CompletedProcess reports."""
    import contextlib
    import io
    import logging
    import traceback

    import keras

    from common.tf_logging import PROGRESS_FORMAT, PROGRESS_TIME_FORMAT

    stdout, stderr = io.StringIO(), io.StringIO()
    # The commands' logging.basicConfig does nothing when the root logger has a handler (pytest adds its own): this
    # one writes the progress lines to the captured stdout in the commands' format.
    handler = logging.StreamHandler(stdout)
    handler.setFormatter(logging.Formatter(PROGRESS_FORMAT, datefmt=PROGRESS_TIME_FORMAT))
    root = logging.getLogger()
    environment, directory = dict(os.environ), os.getcwd()
    keras.backend.clear_session(free_memory=False)
    root.addHandler(handler)
    os.chdir(cwd or REPO_ROOT)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = entry(entry_argv)
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
            except Exception:  # noqa: BLE001 - a process would print it and exit 1; so does this.
                traceback.print_exc()
                code = 1
    finally:
        root.removeHandler(handler)
        os.chdir(directory)
        os.environ.clear()
        os.environ.update(environment)
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())


# Run(warm=True): the process loads TensorFlow and the trainer, then waits for a line on stdin before it runs
# train.py as `python train.py ARGS` would (runpy, as __main__).
_WARM_START = ("import sys, runpy, tensorflow, training.trainer; sys.argv = sys.argv[1:]; sys.stdin.readline(); "
               "runpy.run_path(sys.argv[0], run_name='__main__')")


class Run:
    """`python train.py ARGS` in the background (tests/forked_python.py: a forked child where it can be one); its
    stdout and stderr lines collected as they come."""

    def __init__(self, *args: str, env: dict | None = None, environment: dict | None = None, warm: bool = False):
        """`env` is added to this process's environment; `environment` replaces it. `warm`: the command starts when
        `go()` is called, its interpreter and TensorFlow already loaded: for a test whose timing starts at the
        command, as a new interpreter's start-up takes 5-8 s on a quiet machine and several times that beside other
        tests (a forked child starts at `go()`; a new interpreter starts now and waits for it)."""
        command = [os.path.join(REPO_ROOT, "train.py"), *args]
        environment = environment or {**os.environ, **(env or {})}
        self.process, self.lines, self.errors, self._readers = None, [], [], []
        self._start = lambda: self._started(forked_python.popen(
            command, cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        self._fresh_and_waiting = warm and not forked_python.forkable(command, cwd=REPO_ROOT, env=environment)
        if self._fresh_and_waiting:
            self._started(subprocess.Popen([sys.executable, "-c", _WARM_START, *command], cwd=REPO_ROOT,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True, env=environment))
        elif not warm:
            self._start()

    def _started(self, process) -> None:
        self.process = process
        self._readers = [threading.Thread(target=self._drain, args=(stream, into), daemon=True)
                         for stream, into in ((process.stdout, self.lines), (process.stderr, self.errors))]
        for reader in self._readers:
            reader.start()

    def go(self) -> None:
        """Starts the command of a `warm` Run."""
        if not self._fresh_and_waiting:
            self._start()
            return
        self.process.stdin.write("go\n")
        self.process.stdin.close()

    @staticmethod
    def _drain(stream, into: list) -> None:
        for line in stream:
            into.append(line)

    def wait_for(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never came (exit {self.process.poll()}):\n{self.stdout[-3000:]}\n"
                                     f"{self.stderr[-3000:]}")
            time.sleep(0.02)

    def wait(self, timeout: float = 300) -> int:
        code = self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()

    @property
    def stdout(self) -> str:
        return "".join(self.lines)

    @property
    def stderr(self) -> str:
        return "".join(self.errors)


def shipped_config(config_file: str, *params: str):
    """The experiment of the config file CONFIG_FILE (repository-relative or absolute) with gin PARAMS applied after
    it, read as train.py reads it (training/config_files.py's parse, then experiment.experiment()). The caller clears
    gin (tests/conftest.py does after each test) before a command under test parses a config itself."""
    from training import config_files, experiment

    config_files.parse([config_file], list(params), search_path=REPO_ROOT)
    return experiment.experiment()


# `python -m MODULE`'s main function for run_module in this process: (module holding main, whether main's argv
# starts with the program name as sys.argv does).
MODULE_ENTRY_POINTS = {"stage": ("stage.cli", False), "tools.predict": ("tools.predict", False),
                       "tools.compare": ("tools.compare", False),
                       "training.replica_invariance": ("training.replica_invariance", True)}


def run_module(module: str, *args: str, timeout: float = 300, process: bool = False):
    """Runs `python -m MODULE ARGS` from the repository root; returns the CompletedProcess. In this process
    (MODULE_ENTRY_POINTS, as run_train_py does) unless `process=True`; `timeout` bounds a process only."""
    import importlib

    if process:
        return forked_python.run(["-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                                 timeout=timeout)
    entry_module, with_program_name = MODULE_ENTRY_POINTS[module]
    main = importlib.import_module(entry_module).main
    argv = [module, *args]
    return call_in_process(main, argv if with_program_name else list(args), argv)


_TRAINED_WEIGHTS = {}  # trainer_with_trained_weights: {(config at 1 replica, steps): the weights}


def trainer_with_trained_weights(config, replicas: int, steps: int):
    """A Trainer of `config` (an ExperimentConfig) on `replicas` mirrored replicas holding the weights that `steps`
    steps of training on one replica give, trained once per config and steps in this worker. For tests of
    evaluation at several replica counts: they need a partly trained model, not the N-replica training trace (most
    of such a test's time) that training it again at each count costs; training at any count gives the same weights
    (tests/test_replica_invariance.py)."""
    import dataclasses

    from tpu_utils.strategy import make_strategy
    from training.trainer import Trainer

    one_replica = dataclasses.replace(config, virtual_devices=1)
    key = (repr(one_replica), steps)
    if key not in _TRAINED_WEIGHTS:
        reference = Trainer(one_replica, make_strategy("mirrored", virtual_devices=1))
        reference.train(reference.train_iterator(), steps)
        _TRAINED_WEIGHTS[key] = reference.model.get_weights()
    trainer = Trainer(config, make_strategy("mirrored", virtual_devices=replicas))
    trainer.model.set_weights(_TRAINED_WEIGHTS[key])
    return trainer


def litert_runner(model_path: str):
    """The serving_default signature runner of a .tflite file in LiteRT's own interpreter (`ai_edge_litert`, the
    package docs/serving.md names; requirements-dev.txt installs it), as an app or server would load the file."""
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_path=model_path).get_signature_runner("serving_default")


def checkpoint_values(model_dir: str) -> dict:
    """{variable key: value} of the latest checkpoint under model_dir/checkpoints (weights, slots, step)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")))
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if not key.startswith("_CHECKPOINTABLE_OBJECT_GRAPH") and "save_counter" not in key}


def write_class_images(root: str, sizes: dict, shape=(8, 8, 3)) -> None:
    """root/SPLIT/CLASS/*.png for python -m stage --from_image_folder: 'red' images are bright in channel 0, 'blue' in
    channel 2 (plus noise)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(1)
    for split, count in sizes.items():
        for channel, name in ((0, "red"), (2, "blue")):
            os.makedirs(f"{root}/{split}/{name}")
            for index in range(count):
                image = rng.integers(0, 90, shape).astype(np.uint8)
                image[..., channel] += 150
                tf.io.write_file(f"{root}/{split}/{name}/{index}.png", tf.io.encode_png(image))


def start_in_own_terminal(argv: list[str], columns: int = 0):
    """Starts `argv` in a terminal of its own, as a login shell's job runs: a pseudo-terminal that is its stdin,
    stdout, stderr and controlling terminal, the process its session leader (so closing the terminal sends it SIGHUP).
    `columns` > 0 sizes the terminal (0 x 0 otherwise). Returns (process, the terminal's master fd): read the output
    from it with `read_terminal_until`, close it to close the terminal."""
    import fcntl
    import pty
    import struct
    import termios

    master, terminal = pty.openpty()
    if columns:
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdin=terminal, stdout=terminal, stderr=terminal,
                               start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(terminal)
    return process, master


def read_terminal_until(master: int, pattern: bytes, timeout: float = 180) -> bytes:
    """The terminal's output until it matches the regular expression `pattern` (AssertionError after `timeout` s)."""
    import re
    import select
    import time

    output, deadline = b"", time.monotonic() + timeout
    while not re.search(pattern, output):
        ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {pattern!r} in {timeout} s: {output[-3000:]!r}")
        output += os.read(master, 65536)
    return output
