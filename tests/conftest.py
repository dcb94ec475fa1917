"""Test-wide set-up: loopback-only network, 8 virtual CPU devices, a private TFDS data_dir, clean gin state.

- Nothing leaves the machine: GCE_METADATA_HOST/GCE_METADATA_IP point at a loopback stub (tests/metadata_stub.py)
  and NO_GCE_CHECK=true, in this process and (through the environment) in every subprocess a test starts.
- Replicas on a CPU: the CPU is split into 8 logical devices before TensorFlow initialises, so MirroredStrategy
  can run 1-8 replicas in this process (training/replica_invariance.py uses ReductionToOneDevice for that).
- TFDS_DATA_DIR points at a per-session folder: tests build the bundled digits dataset there and never touch
  ~/tensorflow_datasets or the network.
- gs://: the `gcs` fixture starts a real GCS API server on loopback (tests/gcs_server/emulator.py) on first use, with
  exact object names as on GCS; `gcs_bucket` gives a test a fresh bucket; `gcs_persistent` is a server that can be
  stopped and restarted without losing objects. TensorFlow's GCS retry settings are set before it is imported.
"""

import os
import subprocess
import sys
import tempfile
import time

import pytest

import forked_python
from forked_python import REPO_ROOT  # One spelling of the repository's root for the tests.

VIRTUAL_CPUS = 8
_SESSION_DIR = tempfile.mkdtemp(prefix="template-tests-")
_stub_process = None


def _start_metadata_stub() -> str:
    global _stub_process
    port_file = os.path.join(_SESSION_DIR, "metadata_port")
    _stub_process = subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, "tests", "metadata_stub.py"), port_file])
    deadline = time.monotonic() + 20
    while not (os.path.exists(port_file) and open(port_file).read()):
        if time.monotonic() > deadline or _stub_process.poll() is not None:
            raise RuntimeError("the loopback metadata stub did not start")
        time.sleep(0.05)
    return f"127.0.0.1:{open(port_file).read()}"


def pytest_configure(config):
    sys.path.insert(0, REPO_ROOT)
    metadata = _start_metadata_stub()
    from tests.gcs_server.emulator import EARLY_ENVIRONMENT

    os.environ.update(EARLY_ENVIRONMENT)  # Before TensorFlow is imported (below): it reads them once.
    os.environ.update({
        "GCE_METADATA_HOST": metadata, "GCE_METADATA_IP": metadata, "GCE_METADATA_ROOT": metadata,
        "NO_GCE_CHECK": "true", "no_proxy": "127.0.0.1,localhost",
        "TFDS_DATA_DIR": os.path.join(_SESSION_DIR, "tensorflow_datasets"),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    })
    if not _distributes_the_tests(config):  # A controller of xdist's workers runs no test: no TensorFlow (4 s).
        from tpu_utils.strategy import configure_virtual_cpus

        configure_virtual_cpus(VIRTUAL_CPUS)
    # The session's environment, before any test changes it and after TensorFlow's import has set its own variables
    # (TF2_BEHAVIOR, KMP_*, TPU_ML_PLATFORM*, ...): a command whose environment differs from it is not forked.
    forked_python.configure(os.environ)


def _distributes_the_tests(config) -> bool:
    """This process hands the tests to pytest-xdist's workers (`-n N`, N >= 1) and runs none itself (xdist's own
    condition: a distribution mode and workers, not a collection only)."""
    option = config.option
    return (not hasattr(config, "workerinput") and not option.collectonly and getattr(option, "dist", "no") != "no"
            and bool(getattr(option, "tx", None)))


# The tests of the core (what every run executes: tests/test_layout.py says which folders): `pytest -m core` runs
# those not marked slow, a forker's fast check after an edit (docs/testing.md). CI runs every test.
CORE_TEST_MODULES = frozenset({
    "test_layout", "test_core_alone", "test_one_step", "test_configs", "test_cli_errors", "test_setting_bounds",
    "test_input_errors", "test_data_pipeline", "test_device_split", "test_shard_stream", "test_tasks",
    "test_text_task", "test_evaluation", "test_replica_state", "test_replica_invariance", "test_precision",
    "test_dropout", "test_strategy", "test_tf_config", "test_finite_guard", "test_resume_and_export",
    "test_checkpoint_integrity", "test_watch_run", "test_run_lock", "test_tpu_init",
    "test_tpu_startup", "test_docs_links", "test_early_stopping", "test_data_service", "test_batch_norm_sync",
})


def pytest_ignore_collect(collection_path, config):
    """In a fork without some of the extras (common/extras.py FOLDERS), their tests are not collected: a test module
    that imports a deleted extra, itself or through a test helper, is left out. The core's test modules import none
    (tests/test_layout.py), so `pytest -m core` runs all of them there (tests/test_core_alone.py)."""
    from common.extras import FOLDERS

    missing = [folder.replace("/", ".") for folder in FOLDERS if not os.path.isdir(os.path.join(REPO_ROOT, folder))]
    if not missing or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    from test_layout import extras_reached

    reached = extras_reached(collection_path.stem)
    return any(name == extra or name.startswith(extra + ".") for name in reached for extra in missing) or None


# The fork run (tests/test_core_alone.py) runs every core test in a copy without the extras. A session that selects it
# leaves the core tests to it rather than running each twice (the copy differs from this tree only by the extras,
# which no core test may need), except those that read every file of the tree, extras included.
FORK_RUN = "test_core_alone.py::test_the_cores_tests_pass_in_a_fork_without_the_extras"
WHOLE_TREE_MODULES = frozenset({"test_layout", "test_docs_links"})


def _module(item) -> str:
    return item.module.__name__.rsplit(".", 1)[-1]


# What this session collected, before `-m` and `-k` select: the test modules, and the core's fast tests (the fork
# run checks that it ran as many).
MODULES_COLLECTED = pytest.StashKey[set]()
CORE_TESTS_COLLECTED = pytest.StashKey[list]()


def pytest_itemcollected(item):
    """Marks the core's fast tests `core` (before `-m` selects), and records what was collected."""
    item.config.stash.setdefault(MODULES_COLLECTED, set()).add(_module(item))
    if _module(item) in CORE_TEST_MODULES and item.get_closest_marker("slow") is None:
        item.add_marker(pytest.mark.core)
        item.config.stash.setdefault(CORE_TESTS_COLLECTED, []).append(item.nodeid)


@pytest.hookimpl(trylast=True)  # After `-m` and `-k` have selected: only a fork run that will run counts.
def pytest_collection_modifyitems(config, items):
    if not any(item.nodeid.endswith(FORK_RUN) for item in items):
        return
    in_the_fork = [item for item in items
                   if item.get_closest_marker("core") is not None and _module(item) not in WHOLE_TREE_MODULES]
    if in_the_fork:
        config.hook.pytest_deselected(items=in_the_fork)
        moved = set(in_the_fork)
        items[:] = [item for item in items if item not in moved]
    # The fork run first: the longest test, started by the first worker at once rather than wherever its module
    # falls, where it could end the session minutes after the other worker ran out of tests.
    items.sort(key=lambda item: not item.nodeid.endswith(FORK_RUN))


def pytest_unconfigure(config):
    if _stub_process is not None:
        _stub_process.terminate()
        _stub_process.wait(timeout=10)


@pytest.fixture(scope="session")
def data_dir() -> str:
    """TFDS data_dir holding the bundled digits dataset (built once per session)."""
    from data import builders
    from data.registry import get_dataset_spec

    builders.load_builder(get_dataset_spec("digits"), os.environ["TFDS_DATA_DIR"])
    return os.environ["TFDS_DATA_DIR"]


@pytest.fixture(scope="session")
def fake_imagenet(tmp_path_factory):
    """(data_dir, builder): TFDS's real imagenet2012 builder run on tiny fake tar files (tests/fake_imagenet.py):
    60 train images in 4 shard files, 20 validation images; built once per session (~1 s)."""
    from tests.fake_imagenet import prepare_fake_imagenet

    root = tmp_path_factory.mktemp("fake_imagenet")
    builder = prepare_fake_imagenet(str(root / "tensorflow_datasets"), str(root / "manual"), num_shards=4)
    return str(root / "tensorflow_datasets"), builder


@pytest.fixture(autouse=True)
def clean_gin():
    import gin

    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture(autouse=True)
def no_leaked_dtype_policy():
    """A Trainer sets Keras' dtype policy (PRECISION) for its build only: a test that leaves another policy behind
    (a leak the next model would inherit) fails."""
    yield
    import keras

    policy = keras.config.dtype_policy().name
    keras.config.set_dtype_policy("float32")
    assert policy == "float32", f"the test left Keras' global dtype policy at {policy!r}"


@pytest.fixture
def small_config(data_dir):
    """Factory of a tiny digits ExperimentConfig; keyword arguments override its fields."""
    from training.config import ExperimentConfig

    def make(**overrides):
        fields = dict(model="mlp", dataset="digits", data_dir=data_dir, global_batch_size=48, train_steps=40,
                      steps_per_loop=5, checkpoint_every=0, eval_every=0, learning_rate=0.1, optimizer="sgd",
                      strategy="default")
        fields.update(overrides)
        return ExperimentConfig(**fields)

    return make


@pytest.fixture(scope="session")
def served(tmp_path_factory, data_dir):
    """Factory: served('image' | 'tabular' | 'regression' | 'text') -> the ServedRun of that shipped task (a short
    real training run and its exports, tests/serving_runs.py), made once per session."""
    from serving_runs import train_and_export

    runs = {}

    def get(name: str):
        if name not in runs:
            runs[name] = train_and_export(name, str(tmp_path_factory.mktemp(f"served_{name}")), data_dir)
        return runs[name]

    return get


@pytest.fixture
def fake_gcloud(tmp_path):
    """scripts/tpu_vm.py against a stand-in gcloud (tests/tpu_vm_runs.py fake_cloud): run(scenario, train_plan,
    *flags) -> (result, verbs). Kills what the runs left running on the fake TPU worker and input VMs."""
    from tests.tpu_vm_runs import fake_cloud

    run = fake_cloud(tmp_path)
    yield run
    run.stop()


@pytest.fixture(scope="session")
def gcs():
    """fake-gcs-server + the TLS proxy, started once (~0.3 s), torn down at the end: tests/gcs_server/emulator.py."""
    from tests.gcs_server.emulator import GcsEmulator

    emulator = GcsEmulator().start()
    yield emulator
    emulator.close()


@pytest.fixture
def gcs_bucket(gcs) -> str:
    """A fresh, empty bucket's name."""
    return gcs.new_bucket()


@pytest.fixture
def gcs_persistent():
    """A second GCS server whose objects survive `restart_server()` (the filesystem backend; the proxy keeps its
    names as strict as GCS's), for a test where the server goes away and comes back. It takes over the
    environment (proxy, CA) until the test ends."""
    from tests.gcs_server.emulator import GcsEmulator

    emulator = GcsEmulator(backend="filesystem").start()
    yield emulator
    emulator.close()
