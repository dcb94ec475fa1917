"""The mapping from TPU slices to shipped configs (tools/tpu_configs.py) agrees with the config files.

Each config declares its replica count; a slice must get a config written for exactly its replicas, or a clear
error. (That every TPU config passes `--preflight` is tests/test_preflight.py's job.)
"""

import glob
import os

import pytest

from tests.helpers import REPO_ROOT
from tools import tpu_configs
from tpu_utils.tpu.generations import parse_accelerator_type

TODAYS_SLICES = ["v5litepod-1", "v6e-1", "v5litepod-4", "v6e-4", "v5litepod-8", "v6e-8", "v5p-8", "v4-8", "v3-8",
                 "v2-8"]


def test_every_shipped_tpu_config_is_mapped_and_declares_the_replicas_it_is_mapped_to():
    shipped = {os.path.relpath(path, REPO_ROOT) for path in glob.glob(os.path.join(REPO_ROOT, "configs/tpu/*.gin"))
               if not path.endswith("tpu_base.gin")}
    mapped = {}
    for model, by_replicas in tpu_configs.CONFIGS.items():
        for replicas in by_replicas:
            mapped[tpu_configs.config_for_replicas(model, replicas)] = replicas
    assert set(mapped) == shipped
    for path, replicas in mapped.items():
        assert tpu_configs.declared_replicas(path, REPO_ROOT) == replicas, path


@pytest.mark.parametrize("accelerator_type", TODAYS_SLICES)
def test_each_single_host_slice_gets_a_config_for_its_replicas(accelerator_type):
    for model in ("mnist_cnn", "cifar10_resnet"):
        path = tpu_configs.config_for_accelerator_type(model, accelerator_type)
        assert tpu_configs.declared_replicas(path, REPO_ROOT) == parse_accelerator_type(accelerator_type).replicas


def test_one_chip_runtimes_get_the_one_chip_configs():
    assert tpu_configs.config_for_accelerator_type("cifar10_resnet", "v6e-1") == "configs/tpu/cifar10_resnet_1_chip.gin"
    assert tpu_configs.config_for_accelerator_type("mnist_cnn", "v5litepod-1") == "configs/tpu/mnist_cnn_1_chip.gin"


def test_a_slice_without_a_config_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"no mnist_cnn TPU config for 16 replica\(s\) .*target_replicas=16"):
        tpu_configs.config_for_accelerator_type("mnist_cnn", "v6e-16")
    with pytest.raises(ValueError, match="replica count is unknown"):
        tpu_configs.config_for_accelerator_type("mnist_cnn", "v7x-8")


def test_the_command_line_names_the_config():
    assert tpu_configs.main(["--accelerator_type=v5p-8", "--model=mnist_cnn"]) == 0
    assert tpu_configs.main(["--accelerator_type=v5litepod-16", "--model=mnist_cnn"]) == 2
