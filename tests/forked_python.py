"""Python processes for tests without TensorFlow's import in each: forked from a process that imported it once.

A test that needs a process (a kill, a signal, a freeze, a cluster of workers) ran `python train.py ...` as a new
interpreter, and each start cost 5-8 s of CPU importing TensorFlow, Keras, TFDS and this repository before any work.
Here each pytest worker starts one server process (this file run as a script) that imports them once (PRELOADED),
then forks a child per command. The child is a real process with its own pid, pipes, working directory and
environment; it runs the command as `python ARGS` would (a script, `-m module` or `-c code`, as `__main__`, with the
sys.path that command would have), then ends as an interpreter does (non-daemon threads joined, exit handlers run,
its exit code or the signal that killed it reported). A train.py run of 120 steps: 6 s forked, 12.5 s new.

What a fork cannot give, it does not pretend to (`forkable`): these commands run as a new interpreter instead:
- an environment that differs from the server's in a variable that may be read when a library loads (GCS retries,
  TFDS_DATA_DIR, TF_CPP_*, TPU_*, ...: anything not in RUN_TIME_VARIABLES);
- a command that would import another copy of this repository (a fork's copy), or none (a process that loads an
  export without this repository must not find its modules loaded);
- one started in a session of its own.
A test whose point is the interpreter itself (what an import prints, loads or costs; what runs before TensorFlow
loads) keeps `subprocess` (tests/test_tf_logging.py, tests/test_stage_fast.py, tests/one_step_trace.py).

`popen(args, ...)` and `run(args, ...)` take subprocess's arguments, with ARGS the command line after the
interpreter (`[script, ...]`, `["-m", module, ...]` or `["-c", code, ...]`).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading

# Read when they are used, not when a library loads: a child may differ in these. This repository's own; TF_CONFIG
# (read when a strategy is made); the GCS test server's (tests/gcs_server/emulator.py, each server its own port):
# TensorFlow's gs:// client reads the proxy, CA bundle and test token for each request, google-cloud-storage the
# emulator host and project when a client is made.
RUN_TIME_VARIABLES = frozenset({
    "PYTHONPATH", "PYTEST_CURRENT_TEST", "TF_CONFIG", "TMPDIR", "RUN_LOCK_HEARTBEAT_SECONDS",
    "RUN_LOCK_STALE_AFTER_SECONDS", "https_proxy", "HTTPS_PROXY", "CURL_CA_BUNDLE", "STORAGE_EMULATOR_HOST",
    "GOOGLE_AUTH_TOKEN_FOR_TESTING", "GOOGLE_CLOUD_PROJECT"})
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the server imports once: the libraries, then this repository's entry point and what it imports first.
PRELOADED = ("tensorflow", "keras", "tensorflow_datasets", "sklearn.datasets", "google.cloud.storage", "train",
             "training.trainer", "gcs.run_lock", "data.builders")


# ----- The server: this file run as a script, one per pytest worker. -----

def _serve(socket_path: str) -> None:
    """Forks a child per request; reports each child's end on its request's connection. No threads: a fork copies
    only the thread that calls it, and a lock another thread held would stay locked in the child."""
    import importlib
    import select

    base_path = sys.path[1:]  # Without this file's folder: a child's first entry is its command's.
    sys.path.insert(1, REPO_ROOT)
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # A fork without one of the extras (common/extras.py); a child that needs it fails as it would.
    del sys.path[1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    children = {}  # pid: the connection of its request
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, 0], [], [], 0.05 if children else None)
        if 0 in ready and not os.read(0, 4096):
            os._exit(0)  # The worker that started this server has ended.
        if listener in ready:
            connection, _ = listener.accept()
            size, fds, _, _ = socket.recv_fds(connection, 8, 3)
            request = json.loads(_receive_exactly(connection, int.from_bytes(size, "big")))
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for other in (listener, connection, *children.values()):
                    other.close()
                _child(request, fds, base_path)  # Does not return.
            for fd in fds:
                os.close(fd)
            children[pid] = connection
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = children.pop(pid)
            try:
                connection.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:
                pass  # The test is gone.
            connection.close()


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the request ended early")
        data += chunk
    return data


def _child(request: dict, fds: list[int], base_path: list[str]) -> None:
    """Becomes `python ARGS` in the request's directory and environment, then exits as an interpreter would."""
    import atexit
    import runpy
    import tempfile
    import traceback
    import types

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # Read again from TMPDIR.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_DFL)
    args = request["args"]
    python_path = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    first = "" if args[0] == "-c" else os.getcwd() if args[0] == "-m" else os.path.dirname(os.path.abspath(args[0]))
    sys.path[:] = [first, *python_path, *base_path]
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    code = 0
    try:
        if args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        elif args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - as an interpreter: print it, exit 1.
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # What an interpreter does at its end: join the non-daemon threads, then exit handlers.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code == -signal.SIGINT:  # An uncaught KeyboardInterrupt ends an interpreter by SIGINT.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


# ----- The client: what tests call. -----

# The environment the server loads its libraries in: the test session's, as tests/conftest.py set it up (`configure`),
# not that of whichever test first needs a process (one that changed a variable would make the server refuse the
# session's own commands).
_environment: dict | None = None


def configure(environment: dict) -> None:
    """Sets the environment the server will load its libraries in (tests/conftest.py: the session's)."""
    global _environment
    _environment = dict(environment)


class _Server:
    def __init__(self):
        import tempfile

        self.socket_path = os.path.join(tempfile.mkdtemp(prefix="forked-python-"), "socket")
        self.environment = {key: value for key, value in (_environment or os.environ).items() if key != "PYTHONPATH"}
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.socket_path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.environment)
        if self.process.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the forking server did not start (exit {self.process.wait()})")

    def alive(self) -> bool:
        return self.process.poll() is None

    def accepts(self, env: dict) -> bool:
        """Whether a child with environment `env` is what a new interpreter with it would be."""
        keys = (set(env) | set(self.environment)) - RUN_TIME_VARIABLES
        return all(env.get(key) == self.environment.get(key) for key in keys)


def _imports_this_repository(args: list[str], cwd: str, env: dict) -> bool:
    """Whether `python ARGS` in `cwd` with `env` would import this repository's packages from REPO_ROOT, the copy
    the server has loaded: the first folder of its sys.path holding them is REPO_ROOT. A command of another copy, or
    of none (a process that loads an export without this repository), needs a new interpreter."""
    first = cwd if args[0] in ("-c", "-m") else os.path.dirname(os.path.abspath(os.path.join(cwd, args[0])))
    for folder in [first, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]:
        if os.path.isdir(os.path.join(folder, "training")):
            return os.path.realpath(folder) == os.path.realpath(REPO_ROOT)
    return False


def forkable(args: list[str], *, cwd: str | None = None, env: dict | None = None,
             start_new_session: bool = False) -> bool:
    """Whether `popen` runs `python ARGS` as a child of the forking server (else as a new interpreter)."""
    env = dict(os.environ if env is None else env)
    return (not start_new_session and _imports_this_repository(list(args), os.path.abspath(cwd or os.getcwd()), env)
            and _the_server().accepts(env))


_server: _Server | None = None


def _the_server() -> _Server:
    global _server
    if _server is None or not _server.alive():
        _server = _Server()
    return _server


class ForkedProcess:
    """What subprocess.Popen gives, for a child of the server: pid, stdin/stdout/stderr, poll, wait, signals."""

    def __init__(self, args: list[str], connection: socket.socket, streams: tuple):
        self.args, self._connection, self._buffer = args, connection, b""
        self.stdin, self.stdout, self.stderr = streams
        self.returncode = None
        self.pid = self._message()["pid"]

    def _message(self) -> dict:
        while b"\n" not in self._buffer:
            chunk = self._connection.recv(4096)
            if not chunk:
                raise RuntimeError(f"the forking server ended while running {self.args}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._connection.setblocking(False)
            try:
                self.returncode = self._message()["exit"]
            except BlockingIOError:
                pass
            finally:
                self._connection.setblocking(True)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                self.returncode = self._message()["exit"]
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            finally:
                self._connection.settimeout(None)
            self._connection.close()
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple:
        """(stdout, stderr) read to their ends; TimeoutExpired if the child has not ended after `timeout` s."""
        outputs = {}
        readers = [threading.Thread(target=lambda name=name, stream=stream: outputs.__setitem__(name, stream.read()),
                                    daemon=True) for name, stream in (("stdout", self.stdout), ("stderr", self.stderr))
                   if stream is not None]
        for reader in readers:
            reader.start()
        self.wait(timeout)
        for reader in readers:
            reader.join()
        return outputs.get("stdout"), outputs.get("stderr")

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def popen(args: list[str], *, cwd: str | None = None, env: dict | None = None, stdin=None, stdout=None, stderr=None,
          text: bool = False, start_new_session: bool = False):
    """`subprocess.Popen([sys.executable, *args], ...)`: a child of the forking server when it can be one (see the
    module docstring), else that very Popen."""
    env = dict(os.environ if env is None else env)
    if not forkable(args, cwd=cwd, env=env, start_new_session=start_new_session):
        return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                                text=text, start_new_session=start_new_session)
    mode = "" if text else "b"
    ours, theirs, streams = [], [], []
    for index, wanted in enumerate((stdin, stdout, stderr)):
        if wanted == subprocess.PIPE:
            read, write = os.pipe()
            mine, child = (write, read) if index == 0 else (read, write)
            streams.append(os.fdopen(mine, ("w" if index == 0 else "r") + mode))
            theirs.append(child)
            ours.append(child)
            continue
        streams.append(None)
        if wanted == subprocess.STDOUT and index == 2:
            theirs.append(theirs[1])
        elif wanted == subprocess.DEVNULL or (wanted is None and index == 0):
            null = os.open(os.devnull, os.O_RDWR)
            theirs.append(null)
            ours.append(null)
        elif wanted is None:
            theirs.append(index)
        else:
            theirs.append(wanted if isinstance(wanted, int) else wanted.fileno())
    request = json.dumps({"args": list(args), "cwd": os.path.abspath(cwd or os.getcwd()), "env": env}).encode()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(_the_server().socket_path)
        socket.send_fds(connection, [len(request).to_bytes(8, "big")], theirs)
        connection.sendall(request)
        return ForkedProcess(list(args), connection, tuple(streams))
    finally:
        for fd in ours:
            os.close(fd)


def run(args: list[str], *, cwd: str | None = None, env: dict | None = None, capture_output: bool = False,
        text: bool = False, timeout: float | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, *args], ...)` through `popen`: on a timeout the child is killed."""
    pipe = subprocess.PIPE if capture_output else None
    process = popen(args, cwd=cwd, env=env, stdout=pipe, stderr=pipe, text=text)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return subprocess.CompletedProcess([sys.executable, *args], process.returncode, out, err)


if __name__ == "__main__":
    _serve(sys.argv[1])
