"""notebooks/colab_tpu.ipynb runs top to bottom on this CPU machine (Colab-only cells guarded).

No TPU and no Colab here: the notebook must say so plainly and fall back to the tiny offline config, whose preflight
and training cells really call the template (a broken import or API fails this test). A one-chip Colab TPU runtime
is faked by its accelerator type alone (TPU_ACCELERATOR_TYPE, the start-up's first source; the chip itself cannot
be faked): the notebook must pick the one-chip config for it, and still fall back when TensorFlow finds no chip.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

NOTEBOOK = os.path.join(REPO_ROOT, "notebooks", "colab_tpu.ipynb")


def _cells() -> list[str]:
    with open(NOTEBOOK) as handle:
        return [("".join(cell["source"])) for cell in json.load(handle)["cells"] if cell["cell_type"] == "code"]


def _run(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, str]:
    result = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tests", "run_notebook.py"), NOTEBOOK, *args],
                            cwd=os.path.join(REPO_ROOT, "notebooks"), capture_output=True, text=True, timeout=600,
                            env={**os.environ, **(env or {})})
    return result, result.stdout + result.stderr


def test_notebook_has_no_magics_and_guards_colab_only_cells():
    cells = _cells()
    assert not [line for cell in cells for line in cell.splitlines() if line.lstrip().startswith(("!", "%"))]
    for cell in cells:
        if "google.colab import" in cell or "pip" in cell or "notebook.start" in cell:
            assert "if IN_COLAB:" in cell, cell


def test_the_tpu_start_up_comes_before_any_tensorflow_import():
    cells = _cells()
    startup = next(index for index, cell in enumerate(cells) if "prepare_tpu_environment()" in cell)
    first_tensorflow = next(index for index, cell in enumerate(cells)
                            if "import tensorflow" in cell or "import train" in cell or "tpu_utils.strategy" in cell)
    assert startup < first_tensorflow
    assert "--preflight" in next(cell for cell in cells if "--preflight" in cell) and \
        "subprocess.run" in next(cell for cell in cells if "--preflight" in cell)  # Preflight in its own process.


def test_notebook_runs_top_to_bottom_on_cpu(data_dir):
    result, output = _run(env={"TPU_ACCELERATOR_TYPE": ""})
    assert result.returncode == 0 and "NOTEBOOK OK" in result.stdout, output[-4000:]
    assert "Not on Colab" in output and "No TPU in this runtime" in output
    assert "preflight passed." in output
    assert "step 40: eval accuracy" in output


@pytest.mark.parametrize("accelerator_type", ["v5litepod-1", "v6e-1"])
def test_a_one_chip_runtime_gets_the_one_chip_config(accelerator_type, data_dir):
    """Faked: the accelerator type (the chip itself cannot be): the choice is made and said, then the CPU fallback."""
    result, output = _run("--until=config_for_replicas(MODEL", env={"TPU_ACCELERATOR_TYPE": accelerator_type})
    assert result.returncode == 0 and "NOTEBOOK STOPPED" in result.stdout, output[-4000:]
    assert f"({accelerator_type}), 1 chip(s), 1 replica(s), single host, PJRT" in output  # The start-up decision.
    assert "1 chip(s), 1 replica(s): chose configs/tpu/cifar10_resnet_1_chip.gin." in output
    assert "TensorFlow cannot use it" in output and "Not training configs/tpu/cifar10_resnet_1_chip.gin" in output
