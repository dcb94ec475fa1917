"""tests/forked_python.py: a forked child behaves as `python ARGS` as a new interpreter does, and what a fork cannot
give (a library that read its environment when it loaded) falls back to a new interpreter."""

import os
import signal
import subprocess
import sys

import pytest

import forked_python
from helpers import REPO_ROOT

# What a command sees of its interpreter, printed as one line each; then how it ends (argument 1).
REPORT = """
import atexit, os, sys, threading, time
print('argv', sys.argv)
print('path0', repr(sys.path[0]))
print('cwd', os.getcwd())
print('variable', os.environ.get('TF_CONFIG'))
print('name', __name__)
print('repository first', [p for p in sys.path if os.path.isdir(os.path.join(p or '.', 'training'))][:1])
atexit.register(lambda: print('exit handler', flush=True))
def late():
    time.sleep(0.2)
    print('non-daemon thread done', flush=True)
threading.Thread(target=late).start()
ending = sys.argv[1]
if ending == 'code':
    sys.exit(3)
if ending == 'message':
    sys.exit('a message')
if ending == 'exception':
    raise ValueError('boom')
if ending == 'interrupt':
    raise KeyboardInterrupt
"""


def _both(args: list[str], cwd: str, env: dict) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    assert forked_python.forkable(args, cwd=cwd, env=env)
    forked = forked_python.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    fresh = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    return forked, fresh


@pytest.mark.parametrize("ending", ["normal", "code", "message", "exception", "interrupt"])
def test_a_forked_command_prints_and_ends_as_a_new_interpreter(ending, tmp_path):
    """A `-c` command and the same as a script: same stdout, exit code (an uncaught KeyboardInterrupt ends by
    SIGINT), last stderr line; the exit handler runs after the non-daemon thread, as in a new interpreter."""
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    env = {**os.environ, "TF_CONFIG": "{}"}  # One of RUN_TIME_VARIABLES: its own value.
    for args, cwd in ((["-c", REPORT, ending], str(tmp_path)), ([str(script), ending], REPO_ROOT)):
        forked, fresh = _both(args, cwd, env)
        assert forked.stdout == fresh.stdout, (forked.stdout, fresh.stdout)
        assert forked.returncode == fresh.returncode, (forked.returncode, fresh.returncode, forked.stderr)
        assert forked.stderr.strip().splitlines()[-1:] == fresh.stderr.strip().splitlines()[-1:], forked.stderr
        lines = forked.stdout.splitlines()
        assert lines[-2:] == ["non-daemon thread done", "exit handler"], lines
    assert {"normal": 0, "code": 3, "message": 1, "exception": 1, "interrupt": -signal.SIGINT}[ending] == \
        forked.returncode


def test_a_module_runs_as_main_from_the_working_directory():
    forked, fresh = _both(["-m", "tools.compare", "--help"], REPO_ROOT, dict(os.environ))
    assert forked.returncode == fresh.returncode == 0
    assert forked.stdout == fresh.stdout and "usage: python -m tools.compare" in forked.stdout


def test_a_killed_child_reports_the_signal():
    process = forked_python.popen(["-c", "import time; print('up', flush=True); time.sleep(60)"],
                                  stdout=subprocess.PIPE, text=True)
    assert isinstance(process, forked_python.ForkedProcess)
    assert process.stdout.readline() == "up\n" and process.poll() is None
    process.kill()
    assert process.wait(timeout=10) == -signal.SIGKILL
    process.stdout.close()


def test_what_a_library_reads_when_it_loads_falls_back_to_a_new_interpreter(tmp_path):
    """TFDS reads TFDS_DATA_DIR when it loads: a command with another value runs as a new interpreter and sees it.
    Negative control: forked anyway (the rule bypassed), the child sees the server's value, not its own."""
    code = "import tensorflow_datasets as tfds; print(tfds.core.constants.DATA_DIR)"
    env = {**os.environ, "TFDS_DATA_DIR": str(tmp_path)}
    assert not forked_python.forkable(["-c", code], cwd=REPO_ROOT, env=env)
    process = forked_python.popen(["-c", code], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert not isinstance(process, forked_python.ForkedProcess)
    assert process.communicate(timeout=120)[0].strip() == str(tmp_path)

    server = forked_python._the_server()
    accepts = server.accepts
    server.accepts = lambda env: True
    try:
        forked = forked_python.run(["-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.accepts = accepts
    assert forked.stdout.strip() == os.environ["TFDS_DATA_DIR"] != str(tmp_path)


def test_another_copy_of_the_repository_or_none_is_a_new_interpreter(tmp_path):
    copy, elsewhere = tmp_path / "copy", tmp_path / "elsewhere"
    (copy / "training").mkdir(parents=True)
    elsewhere.mkdir()
    assert not forked_python.forkable([str(copy / "train.py")], cwd=str(copy))
    assert not forked_python.forkable(["-c", "pass"], cwd=str(elsewhere), env={**os.environ, "PYTHONPATH": ""})
    assert forked_python.forkable(["-c", "pass"], cwd=str(elsewhere), env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert forked_python.forkable(["-c", "pass"], cwd=REPO_ROOT)
    assert not forked_python.forkable(["-c", "pass"], cwd=REPO_ROOT, start_new_session=True)


def test_a_train_py_run_beside_the_gcs_test_server_is_forked(gcs):
    """The GCS test server's variables (read per request, tests/forked_python.py RUN_TIME_VARIABLES) do not send the
    commands of the tests that use it to new interpreters (they did: the suite ran no faster)."""
    assert os.environ["STORAGE_EMULATOR_HOST"] != forked_python._the_server().environment.get("STORAGE_EMULATOR_HOST")
    assert forked_python.forkable([os.path.join(REPO_ROOT, "train.py")], cwd=REPO_ROOT)
