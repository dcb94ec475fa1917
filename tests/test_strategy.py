"""Strategy selection: names, 'auto' on a CPU-only host, virtual devices, and bounded TPU failures.

No TPU exists here: the TPU tests stop where a chip would have to answer, and run in a subprocess with a time
bound (a failed TPU initialisation can leave TensorFlow's runtime unusable in that process).
"""

import time

import pytest
import tensorflow as tf

import forked_python
from common.errors import ConfigError
from helpers import REPO_ROOT
from tpu_utils import strategy as strategy_module
from tpu_utils.strategy import make_strategy


def test_auto_on_a_cpu_only_host_is_the_default_strategy():
    started = time.monotonic()
    assert isinstance(make_strategy("auto"), type(tf.distribute.get_strategy()))
    assert time.monotonic() - started < 1.0


def test_auto_picks_tpu_when_a_tpu_device_file_exists(monkeypatch):
    monkeypatch.setattr(strategy_module, "local_tpu_attached", lambda: True)
    picked = []
    monkeypatch.setitem(strategy_module._BUILDERS, "tpu", lambda **kwargs: picked.append(kwargs) or "tpu-strategy")
    assert make_strategy("auto") == "tpu-strategy"
    assert picked == [{"virtual_devices": 0, "tpu": "local", "startup_timeout_seconds": 300}]


@pytest.mark.parametrize("replicas", [1, 2, 8])
def test_mirrored_over_virtual_cpus(replicas):
    strategy = make_strategy("mirrored", virtual_devices=replicas)
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == replicas


def test_unknown_name_and_bad_virtual_devices_are_config_errors():
    with pytest.raises(ConfigError, match="Unknown STRATEGY='gpu'"):
        make_strategy("gpu")
    with pytest.raises(ConfigError, match="VIRTUAL_DEVICES=-1 must be an int >= 0"):
        make_strategy("mirrored", virtual_devices=-1)
    with pytest.raises(ConfigError, match="only works with STRATEGY='mirrored'"):
        make_strategy("default", virtual_devices=2)


def test_multi_worker_without_tf_config_is_a_config_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="needs the TF_CONFIG environment variable"):
        make_strategy("multi_worker_mirrored")


def test_tpu_local_without_a_tpu_fails_fast_with_advice():
    """TPUClusterResolver('local') constructs; initialising finds no TPU: a ConfigError within seconds."""
    script = ("from tpu_utils.strategy import make_strategy\n"
              "from common.errors import ConfigError\n"
              "try:\n    make_strategy('tpu', tpu='local')\n"
              "except ConfigError as error:\n    print('CONFIG_ERROR', error)\n")
    started = time.monotonic()
    result = forked_python.run(["-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 60
    assert "CONFIG_ERROR TPU='local'" in result.stdout, result.stdout + result.stderr
    assert "pick a TPU runtime" in result.stdout
