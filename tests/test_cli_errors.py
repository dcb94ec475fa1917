"""Bad input gets a clear error naming the value and the fix, and exit code 2, before any training step."""

import os

import pytest

import train
from helpers import run_train_py

DIGITS = "configs/experiments/digits_mlp.gin"


@pytest.mark.parametrize("gin_params, expected", [
    (["STRATEGY='tpu_v9'"], "Unknown STRATEGY='tpu_v9'"),
    (["MODEL='resnet9000'"], "Unknown MODEL='resnet9000'. Known models: cnn, mlp"),
    (["DATASET='imagenet21k'"], "Unknown DATASET='imagenet21k'"),
    (["STRATEGY='mirrored'", "VIRTUAL_DEVICES=3", "GLOBAL_BATCH_SIZE=64"],
     "GLOBAL_BATCH_SIZE=64 does not divide by the 3 replicas of this strategy. Use a multiple of 3, e.g. 63 or 66"),
    (["TRAIN_STEPS=0"], "TRAIN_STEPS=0 must be an integer >= 1"),
    (["TRAIN_STEPS=-5"], "TRAIN_STEPS=-5 must be an integer >= 1"),
    (["STEPS_PER_LOOP=0"], "STEPS_PER_LOOP=0 must be an integer >= 1"),
    (["EVAL_EVERY=150"], "EVAL_EVERY=150 must be a multiple of STEPS_PER_LOOP=100"),
    (["LEARNING_RATE=-0.1"], "LEARNING_RATE=-0.1 must be a finite number > 0"),
    (["PRECISION='float8'"], "PRECISION='float8' is not one of"),
    (["VIRTUAL_DEVICES=2"], "VIRTUAL_DEVICES=2 only works with STRATEGY='mirrored'"),
    (["experiment.optimizer='lion'"], "Unknown optimizer 'lion'"),
    (["mlp.no_such_argument=1"], "Could not parse the gin configuration"),
])
def test_bad_config_exits_2_with_a_clear_message(gin_params, expected, tmp_path, capsys, data_dir):
    args = ["train.py", f"--gin_file={DIGITS}", f"--model_dir={tmp_path}"] + [f"--gin_param={p}" for p in gin_params]
    assert train.main(args) == 2
    assert expected in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "checkpoints")  # Nothing started.


def test_missing_gin_file_exits_2(tmp_path, capsys):
    assert train.main(["train.py", "--gin_file=configs/nope.gin", f"--model_dir={tmp_path}"]) == 2
    assert "--gin_file='configs/nope.gin' does not exist" in capsys.readouterr().err


def test_missing_required_macro_exits_2(tmp_path, capsys):
    assert train.main(["train.py", "--gin_file=configs/base.gin", f"--model_dir={tmp_path}"]) == 2
    assert "does not set MODEL, DATASET, GLOBAL_BATCH_SIZE, TRAIN_STEPS, LEARNING_RATE" in capsys.readouterr().err


def test_eval_without_a_checkpoint_exits_2(tmp_path, capsys, data_dir):
    assert train.main(["train.py", f"--gin_file={DIGITS}", f"--model_dir={tmp_path}", "--mode=eval"]) == 2
    assert "No checkpoint in" in capsys.readouterr().err


def test_exit_code_2_through_the_real_command_line(tmp_path):
    result = run_train_py("--gin_param=MODEL='nope'", f"--model_dir={tmp_path}")
    assert result.returncode == 2
    assert "Unknown MODEL='nope'" in result.stderr and "Traceback" not in result.stderr
