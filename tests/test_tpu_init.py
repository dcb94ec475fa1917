"""TPU initialisation up to the hardware boundary: every decision and failure message, each within a time bound.

No TPU exists here (and no fake TPU backend): what is covered is everything before a chip would answer. The GCE
metadata server that TPU name lookups query is the loopback stub of conftest.py, so nothing leaves the machine.
"""

import subprocess
import sys
import time
import types

import pytest

import forked_python
from common.errors import ConfigError
from common.loopback import free_loopback_ports
from tests.helpers import REPO_ROOT, run_train_py
from tpu_utils.tpu import initialize as tpu_init


@pytest.mark.parametrize("tpu", ["local", "my-tpu-pod", "v3-32", "grpc://10.0.0.2:8470"])
def test_well_formed_tpu_settings(tpu):
    environ = {} if tpu == "local" else {"TPU_LOAD_LIBRARY": "0"}
    tpu_init.check_tpu_setting(tpu, environ)


@pytest.mark.parametrize("tpu", ["", "My_TPU", "pod name", "-pod", "grpc://host", None, 8])
def test_malformed_tpu_settings_name_the_value(tpu):
    with pytest.raises(ConfigError, match=f"TPU={tpu!r}: expected 'local'"):
        tpu_init.check_tpu_setting(tpu, {"TPU_LOAD_LIBRARY": "0"})


def test_a_pod_name_needs_tpu_load_library_0():
    for environ in ({}, {"TPU_LOAD_LIBRARY": "1"}):
        with pytest.raises(ConfigError, match="Start it with TPU_LOAD_LIBRARY=0 in the environment"):
            tpu_init.check_tpu_setting("my-tpu-pod", environ)


def test_local_with_tpu_load_library_0_is_refused():
    with pytest.raises(ConfigError, match="TPU='local' but TPU_LOAD_LIBRARY=0 is set"):
        tpu_init.check_tpu_setting("local", {"TPU_LOAD_LIBRARY": "0"})


def test_train_py_exits_2_when_tpu_load_library_is_wrong(tmp_path, data_dir, monkeypatch):
    """train.py's own check of the variable, in this process: what TensorFlow does with it when it loads (a TPU
    build loads libtpu unless it is 0) is not what is tested, and a CPU build ignores it."""
    monkeypatch.setenv("TPU_LOAD_LIBRARY", "")
    result = run_train_py("--gin_param=STRATEGY='tpu'", "--gin_param=TPU='my-tpu-pod'", f"--model_dir={tmp_path}")
    assert result.returncode == 2 and "Start it with TPU_LOAD_LIBRARY=0" in result.stderr


def test_an_unknown_tpu_name_is_a_config_error_within_seconds(monkeypatch):
    monkeypatch.setenv("TPU_LOAD_LIBRARY", "0")
    started = time.monotonic()
    with pytest.raises(ConfigError, match="TPU='no-such-tpu' could not be resolved .*gcloud compute tpus tpu-vm list"):
        tpu_init.make_tpu_strategy("no-such-tpu", startup_timeout_seconds=30)
    assert time.monotonic() - started < 10


def test_an_unreachable_tpu_address_ends_within_the_startup_timeout():
    """A grpc:// address nobody answers: TF's connect waits for minutes while holding the GIL; the watchdog ends it."""
    port = free_loopback_ports(1)[0]
    script = ("import os\nos.environ['TPU_LOAD_LIBRARY'] = '0'\n"
              "import logging; logging.basicConfig(level=logging.INFO)\n"
              "from tpu_utils.tpu.initialize import make_tpu_strategy\n"
              f"make_tpu_strategy('grpc://127.0.0.1:{port}', startup_timeout_seconds=2)\n"
              "print('RETURNED')\n")
    started = time.monotonic()
    # A new interpreter: the script sets TPU_LOAD_LIBRARY before TensorFlow loads, as a TPU VM's start-up would.
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 60
    assert result.returncode != 0 and "RETURNED" not in result.stdout
    output = result.stdout + result.stderr
    # The watchdog ended the wait (status 1), after the advice was logged.
    assert result.returncode == 1 and "Timeout (0:00:02)!" in output, output[-3000:]
    assert "Waiting for TPU 'grpc://127.0.0.1:" in output and "Check that the TPU is READY" in output


def test_versions_and_topology_are_described():
    versions = tpu_init.software_versions()
    assert set(versions) == {"tensorflow", "keras", "tensorflow-tpu", "libtpu"}
    assert versions["tensorflow"].startswith("2.20") and versions["libtpu"] == "not installed"
    # A stand-in for tf.tpu.experimental.Topology (no TPU here): a v3-32 slice.
    topology = types.SimpleNamespace(num_tasks=4, num_tpus_per_task=8, mesh_shape=[4, 4, 2])
    assert tpu_init.describe_topology(topology) == "4 host(s) x 8 TPU core(s) = 32 cores, mesh shape [4, 4, 2]"


def _requirement_lines(name: str) -> list[str]:
    with open(f"{REPO_ROOT}/{name}") as handle:
        return [line.split("#")[0].strip() for line in handle if line.split("#")[0].strip()]


def test_tpu_requirements_pin_one_tensorflow_matching_ci():
    tpu = _requirement_lines("requirements-tpu.txt")
    cpu_pin = next(line for line in _requirement_lines("requirements.txt") if line.startswith("tensorflow-cpu=="))
    assert f"tensorflow-tpu=={cpu_pin.split('==')[1]}" in tpu  # What CI tests is what runs on the TPU.
    assert any(line.startswith("libtpu==") for line in tpu)  # Explicit, not whatever libtpu~=0.0.14 resolves to.
    assert not [line for line in tpu if line.split("==")[0].split("[")[0] in ("tensorflow", "tensorflow-cpu")]
    assert "-r requirements-common.txt" in tpu


def test_local_paths_under_a_tpu_strategy_do_their_io_on_this_host():
    import tensorflow as tf

    from tpu_utils.strategy import io_device_for

    # An uninitialised TPUStrategy object stands in for one (none can be built without a TPU): only its type matters.
    tpu_strategy = object.__new__(tf.distribute.TPUStrategy)
    assert io_device_for(tpu_strategy, "/home/me/runs/c10") == "/job:localhost"
    assert io_device_for(tpu_strategy, "gs://bucket/runs/c10") is None
    assert io_device_for(tf.distribute.get_strategy(), "/home/me/runs/c10") is None


def test_a_pjrt_tpu_without_the_start_up_variables_says_how_to_set_them():
    """Faked (no TPU here): a v5e-1's accelerator type and an installed-looking libtpu; the start-up was skipped."""
    script = ("import os, sys\n"
              "from tpu_utils.tpu import initialize as tpu_init\n"
              "from tpu_utils.tpu.facts import RuntimeFacts\n"
              "tpu_init.gather_facts = lambda environ: RuntimeFacts(accelerator_type='v5litepod-1',\n"
              "                                                     libtpu_path='/site-packages/libtpu/libtpu.so')\n"
              "print('HINT:', tpu_init.missing_startup_variables({}))\n"
              "print('SET:', repr(tpu_init.missing_startup_variables({'NEXT_PLUGGABLE_DEVICE_USE_C_API': 'true',\n"
              "      'TF_PLUGGABLE_DEVICE_LIBRARY_PATH': '/site-packages/libtpu/libtpu.so'})))\n"
              "try:\n"
              "    tpu_init.make_tpu_strategy('local', startup_timeout_seconds=60)\n"
              "except tpu_init.ConfigError as error:\n"
              "    print('ERROR:', error)\n")
    result = forked_python.run(["-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert "HINT: NEXT_PLUGGABLE_DEVICE_USE_C_API and TF_PLUGGABLE_DEVICE_LIBRARY_PATH were not set" in result.stdout, \
        result.stdout + result.stderr
    assert "SET: ''" in result.stdout
    error = result.stdout.split("ERROR:", 1)[1]
    assert "TensorFlow found no usable TPU" in error and "prepare_tpu_environment()" in error
