"""The TPU start-up decision (tpu_utils/tpu/startup.py) for every generation, from faked runtime facts.

No TPU exists here, so what a TPU host would show is faked, and only that: the accelerator type (environment
variable or a loopback stand-in for the TPU VM metadata server), TPU chips on the PCI bus and device files (a fake
file tree), and an installed libtpu (a package directory with an empty libtpu.so). The code under test is real,
including in a fresh `python train.py` process, where the variables must be set before TensorFlow is imported.
"""

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from tests.helpers import REPO_ROOT
from tpu_utils.tpu import facts as tpu_facts
from tpu_utils.tpu import startup as tpu_startup
from tpu_utils.tpu.facts import RuntimeFacts, gather_facts
from tpu_utils.tpu.generations import parse_accelerator_type
from tpu_utils.tpu.startup import decide, prepare_tpu_environment

LIBTPU = "/site-packages/libtpu/libtpu.so"
PJRT_ENV = {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": LIBTPU}

# accelerator type: (generation, chips, replicas, pod, runtime) as the Cloud TPU docs define the slices.
SLICES = {
    "v2-8": ("v2", 4, 8, False, "classic"),
    "v3-8": ("v3", 4, 8, False, "classic"),
    "v3-32": ("v3", 16, 32, True, "classic"),
    "v4-8": ("v4", 4, 4, False, "classic"),
    "v4-16": ("v4", 8, 8, True, "classic"),
    "v5litepod-1": ("v5e", 1, 1, False, "pjrt"),
    "v5litepod-4": ("v5e", 4, 4, False, "pjrt"),
    "v5litepod-8": ("v5e", 8, 8, False, "pjrt"),
    "v5litepod-16": ("v5e", 16, 16, True, "pjrt"),
    "v5p-8": ("v5p", 4, 4, False, "pjrt"),
    "v5p-16": ("v5p", 8, 8, True, "pjrt"),
    "v6e-1": ("v6e", 1, 1, False, "pjrt"),
    "v6e-8": ("v6e", 8, 8, False, "pjrt"),
    "v6e-16": ("v6e", 16, 16, True, "pjrt"),
}


@pytest.mark.parametrize("accelerator_type", SLICES)
def test_the_decision_for_each_slice(accelerator_type):
    generation, chips, replicas, pod, runtime = SLICES[accelerator_type]
    decision = decide(RuntimeFacts(accelerator_type=accelerator_type, libtpu_path=LIBTPU, libtpu_version="0.0.21.1"))
    assert (decision.generation, decision.chips, decision.replicas, decision.pod, decision.runtime) == \
        (generation, chips, replicas, pod, runtime)
    expected_env = dict(PJRT_ENV) if runtime == "pjrt" else {}
    if pod:
        expected_env["TPU_LOAD_LIBRARY"] = "0"  # Worker 0 leaves the chips to every host's TPU server.
    assert decision.env == expected_env and decision.notes == ()
    assert f"{chips} chip(s), {replicas} replica(s)" in decision.summary()


def test_a_newer_generation_uses_pjrt_and_an_unknown_spelling_is_refused():
    decision = decide(RuntimeFacts(accelerator_type="v7x-8", device_files=("/dev/vfio/0",), libtpu_path=LIBTPU))
    assert decision.runtime == "pjrt" and decision.env == PJRT_ENV
    with pytest.raises(ValueError, match="'v5-8': unknown TPU generation"):
        parse_accelerator_type("v5-8")
    with pytest.raises(ValueError, match="'v3_8': expected e.g. v3-8"):
        parse_accelerator_type("v3_8")


def test_no_tpu_sets_nothing_and_off_overrides_a_tpu():
    assert decide(RuntimeFacts()).runtime == "none" and decide(RuntimeFacts()).env == {}
    off = decide(RuntimeFacts(accelerator_type="v6e-1", libtpu_path=LIBTPU, requested_runtime="off"))
    assert off.runtime == "none" and off.env == {} and "TPU_RUNTIME=off" in off.summary()
    with pytest.raises(ValueError, match="TPU_RUNTIME='gpu': expected one of auto, pjrt, classic, off"):
        decide(RuntimeFacts(accelerator_type="v6e-1", requested_runtime="gpu"))


def test_pjrt_without_libtpu_and_a_foreign_libtpu_are_explained():
    missing = decide(RuntimeFacts(accelerator_type="v5litepod-1"))
    assert missing.runtime == "pjrt" and missing.env == {}
    assert "libtpu, which is not installed: `pip install -r requirements-tpu.txt`" in missing.notes[0]
    newer = decide(RuntimeFacts(accelerator_type="v4-8", libtpu_version="0.0.52", libtpu_path=LIBTPU))
    assert newer.runtime == "classic" and "libtpu 0.0.52 is installed; this template pins 0.0.21.1" in newer.notes[0]


def test_unknown_generation_keeps_the_classic_runtime_and_says_how_to_choose():
    decision = decide(RuntimeFacts(device_files=("/dev/accel0",), libtpu_path=LIBTPU))
    assert decision.runtime == "classic" and decision.chips == 1 and decision.env == {}
    assert "set TPU_ACCELERATOR_TYPE" in decision.notes[0]
    forced = decide(RuntimeFacts(device_files=("/dev/accel0",), libtpu_path=LIBTPU, requested_runtime="pjrt"))
    assert forced.runtime == "pjrt" and forced.env == PJRT_ENV


def _fake_host(root, generation_device_id: str, chips: int, device_glob: str = "dev/vfio/{}"):
    """A file tree like a TPU host's: `chips` TPU chips on the PCI bus (plus a gVNIC, also Google's), device files."""
    devices = root / "sys" / "bus" / "pci" / "devices"
    for index in range(chips):
        (devices / f"0000:00:0{index}.0").mkdir(parents=True)
        (devices / f"0000:00:0{index}.0" / "vendor").write_text("0x1ae0\n")
        (devices / f"0000:00:0{index}.0" / "device").write_text(f"{generation_device_id}\n")
        path = root / device_glob.format(index)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    (devices / "0000:00:10.0").mkdir(parents=True)
    (devices / "0000:00:10.0" / "vendor").write_text("0x1ae0\n")
    (devices / "0000:00:10.0" / "device").write_text("0x0042\n")  # The gVNIC network card: not a TPU.
    return str(root)


@pytest.fixture
def fake_libtpu(tmp_path, monkeypatch):
    """An installed-looking libtpu 0.0.21.1 (package, empty libtpu.so, dist-info) on sys.path; returns its dir."""
    site = tmp_path / "site"
    (site / "libtpu").mkdir(parents=True)
    (site / "libtpu" / "__init__.py").write_text("raise ImportError('the fake libtpu must never be imported')\n")
    (site / "libtpu" / "libtpu.so").write_bytes(b"")
    (site / "libtpu-0.0.21.1.dist-info").mkdir()
    (site / "libtpu-0.0.21.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: libtpu\n"
                                                                 "Version: 0.0.21.1\n")
    monkeypatch.syspath_prepend(str(site))
    return str(site)


def test_a_colab_style_one_chip_host_from_pci_and_device_files(tmp_path, fake_libtpu):
    root = _fake_host(tmp_path / "root", "0x006f", chips=1)  # One v6e chip, no accelerator type anywhere.
    facts = gather_facts({"TPU_SKIP_MDS_QUERY": "1"}, root=root)
    assert facts.pci_generation == "v6e" and facts.pci_chips == 1 and facts.libtpu_version == "0.0.21.1"
    decision = decide(facts)
    assert (decision.generation, decision.chips, decision.replicas, decision.runtime) == ("v6e", 1, 1, "pjrt")
    assert decision.env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == os.path.join(fake_libtpu, "libtpu", "libtpu.so")


class _Metadata(http.server.BaseHTTPRequestHandler):
    """A loopback stand-in for the TPU VM metadata server: answers the accelerator-type attribute."""

    requests = []

    def do_GET(self):  # noqa: N802 - http.server's naming.
        type(self).requests.append((self.path, self.headers.get("Metadata-Flavor")))
        body = b"v4-8" if self.path.endswith("/instance/attributes/accelerator-type") else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        del args


@pytest.fixture
def metadata_server():
    _Metadata.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_accelerator_type_comes_from_the_metadata_server_only_on_a_tpu_host(tmp_path, metadata_server):
    environ = {"GCE_METADATA_HOST": metadata_server}
    assert gather_facts(environ, root=str(tmp_path / "empty")).accelerator_type is None
    assert _Metadata.requests == []  # No TPU device: the network is not touched.
    root = _fake_host(tmp_path / "root", "0x005e", chips=4, device_glob="dev/accel{}")
    facts = gather_facts(environ, root=root)
    assert facts.accelerator_type == "v4-8" and facts.accelerator_type_source == "the TPU VM metadata server"
    assert _Metadata.requests == [("/computeMetadata/v1/instance/attributes/accelerator-type", "Google")]
    assert decide(facts).runtime == "classic" and decide(facts).replicas == 4
    assert gather_facts({**environ, "TPU_ACCELERATOR_TYPE": "v5p-8"}, root=root).accelerator_type == "v5p-8"
    assert len(_Metadata.requests) == 1  # The environment variable wins without a query.


def test_prepare_sets_the_variables_and_keeps_the_users(caplog):
    environ = {"TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/opt/my/libtpu.so"}
    facts = RuntimeFacts(accelerator_type="v5litepod-8", libtpu_path=LIBTPU, libtpu_version="0.0.21.1")
    with caplog.at_level("INFO", logger=tpu_startup.__name__):
        prepare_tpu_environment(environ, facts)
    assert environ == {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
                       "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/opt/my/libtpu.so"}  # The user's path wins.
    assert "TPU start-up: v5e (v5litepod-8), 8 chip(s), 8 replica(s), single host, PJRT" in caplog.text
    assert "keeping TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/opt/my/libtpu.so" in caplog.text


# Stops the process at the first import of TensorFlow and prints the variables it would have read.
_STOP_AT_TENSORFLOW = """
import json, os, sys
class StopAtTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'tensorflow':
            keys = ('NEXT_PLUGGABLE_DEVICE_USE_C_API', 'TF_PLUGGABLE_DEVICE_LIBRARY_PATH', 'TPU_LOAD_LIBRARY')
            print('AT TENSORFLOW IMPORT', json.dumps({key: os.environ.get(key) for key in keys}), flush=True)
            os._exit(0)
sys.meta_path.insert(0, StopAtTensorFlow())
import train
train.main(['train.py'] + sys.argv[1:])
print('TENSORFLOW WAS NEVER IMPORTED')
"""


@pytest.mark.parametrize("accelerator_type", ["v5litepod-1", "v6e-8", "v4-8"])
def test_train_py_sets_the_environment_before_tensorflow_loads(accelerator_type, fake_libtpu, tmp_path):
    env = {**os.environ, "TPU_ACCELERATOR_TYPE": accelerator_type,
           "PYTHONPATH": os.pathsep.join([fake_libtpu, REPO_ROOT])}
    for variable in ("NEXT_PLUGGABLE_DEVICE_USE_C_API", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "TPU_LOAD_LIBRARY"):
        env.pop(variable, None)
    result = subprocess.run([sys.executable, "-c", _STOP_AT_TENSORFLOW, f"--model_dir={tmp_path}"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120, env=env)
    assert "AT TENSORFLOW IMPORT" in result.stdout, result.stdout + result.stderr
    seen = json.loads(result.stdout.split("AT TENSORFLOW IMPORT", 1)[1].splitlines()[0])
    if SLICES[accelerator_type][4] == "pjrt":
        assert seen == {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TPU_LOAD_LIBRARY": None,
                        "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": os.path.join(fake_libtpu, "libtpu", "libtpu.so")}
    else:
        assert seen == {"NEXT_PLUGGABLE_DEVICE_USE_C_API": None, "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": None,
                        "TPU_LOAD_LIBRARY": None}
    assert f"TPU start-up: {SLICES[accelerator_type][0]} ({accelerator_type})" in result.stdout


def test_gathering_reads_no_tensorflow_and_finds_no_tpu_here():
    assert tpu_facts.find_libtpu() == (None, None)  # This CPU machine: no libtpu installed.
    assert not gather_facts({}).has_tpu


def test_a_vfio_device_without_google_tpu_chips_is_not_a_tpu(tmp_path):
    """Any VFIO pass-through (a GPU, a NIC) makes /dev/vfio/<n>: STRATEGY='auto' and the start-up must not take such
    a host for a TPU VM. With TPU chips on the PCI bus it is one (the control), and /dev/accel<n> always is."""
    (tmp_path / "plain" / "dev" / "vfio").mkdir(parents=True)
    (tmp_path / "plain" / "dev" / "vfio" / "0").write_text("")
    assert not tpu_facts.local_tpu_attached(str(tmp_path / "plain"))
    def no_metadata_query():
        raise AssertionError("a host with no TPU must not query the metadata server")

    assert not gather_facts({}, root=str(tmp_path / "plain"), read_metadata=no_metadata_query).has_tpu
    tpu_host = _fake_host(tmp_path / "tpu", "0x0062", chips=4)
    assert tpu_facts.local_tpu_attached(tpu_host)
    (tmp_path / "old" / "dev").mkdir(parents=True)
    (tmp_path / "old" / "dev" / "accel0").write_text("")
    assert tpu_facts.local_tpu_attached(str(tmp_path / "old"))
