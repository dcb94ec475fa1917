"""Every shipped gin file parses, and every experiment trains 2 loops on CPU with tiny overrides.

The bundled digits dataset is built for real; download-only TFDS datasets (mnist, cifar10) use TFDS's mock data
(the public internet does not exist here), with the same pipeline, model and loop code.
"""

import glob
import os

import gin
import pytest
import tensorflow_datasets as tfds

from helpers import REPO_ROOT
from training import config_files

ALL_GIN_FILES = sorted(glob.glob(os.path.join(REPO_ROOT, "configs", "**", "*.gin"), recursive=True))
EXPERIMENTS = [os.path.join(REPO_ROOT, "configs", "default.gin")] + sorted(
    glob.glob(os.path.join(REPO_ROOT, "configs", "experiments", "*.gin")))
TINY = ["TRAIN_STEPS = 4", "STEPS_PER_LOOP = 2", "EVAL_EVERY = 2", "CHECKPOINT_EVERY = 2", "GLOBAL_BATCH_SIZE = 16",
        "cosine.warmup_steps = 1", "STRATEGY = 'mirrored'", "VIRTUAL_DEVICES = 2"]


def test_configs_exist():
    assert len(EXPERIMENTS) >= 4 and len(ALL_GIN_FILES) >= 10


@pytest.mark.parametrize("path", ALL_GIN_FILES, ids=lambda path: os.path.relpath(path, REPO_ROOT))
def test_every_gin_file_parses_and_has_a_header(path):
    text = open(path).read()
    for field in ("# Purpose:", "# Run:", "# Expected:", "# Overrides:"):
        assert field in text, f"{path} header lacks {field!r}"
    if os.path.basename(os.path.dirname(path)) in ("models", "datasets") or path.endswith("base.gin"):
        # Pieces are parsed on top of base.gin plus the macros an experiment would supply.
        config_files.parse([os.path.join(REPO_ROOT, "configs", "default.gin"), path], [], search_path=REPO_ROOT)
    else:
        config_files.parse([path], [], search_path=REPO_ROOT)
    assert gin.query_parameter("experiment.model") is not None


def test_error_messages_name_exactly_the_macros_base_gin_defines():
    """training/config.py names a field by its macro only when configs/base.gin binds it to one (else an error would
    tell the user to set a macro that does not exist); every other field is experiment.<field>."""
    import re

    from common.settings import MACRO_FIELDS, setting

    text = open(os.path.join(REPO_ROOT, "configs", "base.gin")).read()
    bound = dict(re.findall(r"^experiment\.(\w+) = %(\w+)$", text, re.MULTILINE))
    assert all(macro == field.upper() for field, macro in bound.items()), bound
    assert MACRO_FIELDS == set(bound)
    assert setting("checkpoints_to_keep") == "experiment.checkpoints_to_keep" and setting("seed") == "SEED"


def test_a_field_bound_directly_wins_over_its_macro_which_is_then_not_an_unknown_macro():
    """experiment.train_steps=5 is gin's own way to set the field TRAIN_STEPS feeds; base.gin's macro is then
    unreferenced, and that is not the user's typo (the misspelt and unknown macros stay refused: test_input_errors)."""
    from training import experiment

    config_files.parse([os.path.join(REPO_ROOT, "configs", "default.gin")],
                       ["experiment.train_steps = 5", "experiment.data_service = 'local:2'"], search_path=REPO_ROOT)
    config = experiment.experiment()
    assert (config.train_steps, config.data_service) == (5, "local:2")


@pytest.mark.slow
@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda path: os.path.relpath(path, REPO_ROOT))
def test_every_experiment_runs_two_loops(path, tmp_path, data_dir):
    from training import experiment

    config_files.parse([path], TINY + [f"DATA_DIR = '{tmp_path / 'data'}'"], search_path=REPO_ROOT)
    from data.registry import get_dataset_spec

    model_dir = str(tmp_path / "run")
    if get_dataset_spec(config_files.macro("DATASET")).module:  # Bundled: built offline for real.
        result = experiment.run(model_dir=model_dir)
    else:  # Download-only (MNIST, CIFAR-10): TFDS's mock data.
        with tfds.testing.mock_data(num_examples=40):
            result = experiment.run(model_dir=model_dir)
    assert result["step"] == 4
    assert result["train"]["loss"] > 0 and result["eval"]["loss"] > 0
    assert 0.0 <= result["eval"].get("accuracy", 0.0) <= 1.0
    assert os.path.isdir(os.path.join(model_dir, "export", "4"))
