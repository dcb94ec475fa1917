"""EARLY_STOP_PATIENCE: training ends once BEST_METRIC has not improved for that many evaluations, with a final
checkpoint and export, the best kept in best/ and export/best/, exit 0; a rerun of the same command stays stopped
(it does not train on). Runs the default config's model on digits through train.main, in this process; the rule
itself is checked on planted histories (min delta, 'min' metrics, a non-finite evaluation)."""

import json
import math
import os

import pytest

from common.errors import ConfigError
from helpers import run_train_py

# Evaluations at 20, 40, 60, ...; an improvement of accuracy by more than 1.0 is impossible, so to early stopping
# the evaluation at 20 stays the best and the run stops at 60, after two evaluations without improvement (the rule
# counts evaluations, not steps: 20 steps between them show it as 100 did).
STOPPING = ["--gin_param=TRAIN_STEPS=1000", "--gin_param=STEPS_PER_LOOP=20", "--gin_param=EVAL_EVERY=20",
            "--gin_param=CHECKPOINT_EVERY=0", "--gin_param=BEST_METRIC='eval/accuracy'",
            "--gin_param=EARLY_STOP_PATIENCE=2", "--gin_param=experiment.early_stop_min_delta=1.0"]


def _train(model_dir, *args):
    return run_train_py(f"--model_dir={model_dir}", *args)


def _train_steps(model_dir) -> list[int]:
    records = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
    return [record["step"] for record in records if record["kind"] == "train"]


def test_a_run_stops_early_keeps_its_best_and_stays_stopped(tmp_path):
    model_dir = tmp_path / "run"
    first = _train(model_dir, *STOPPING)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Stopped early at step 60: eval/accuracy has not improved by more than 1 in the last 2 evaluations " \
           "(best" in first.stdout, first.stdout[-3000:]
    assert _train_steps(model_dir) == [20, 40, 60]
    assert os.path.exists(model_dir / "checkpoints" / "ckpt-60.index")
    assert os.path.exists(model_dir / "export" / "60" / "saved_model.pb")
    evaluations = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
    accuracies = {record["step"]: record["metrics"]["accuracy"] for record in evaluations if record["kind"] == "eval"}
    best = json.load(open(model_dir / "best" / "best.json"))  # best/ keeps the highest accuracy (no min delta).
    assert sorted(accuracies) == [20, 40, 60] and best["value"] == max(accuracies.values())
    assert accuracies[best["step"]] == best["value"]
    assert os.path.exists(model_dir / "export" / "best" / "saved_model.pb")
    assert json.load(open(model_dir / "metrics.json"))["step"] == 60
    assert first.stdout.count("eval step 60") == 1  # The stopping evaluation is the final one, not repeated.

    again = _train(model_dir, *STOPPING)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Stopped early at step 60, before this start" in again.stdout
    assert _train_steps(model_dir) == [20, 40, 60]  # Nothing trained on.


def test_without_patience_the_same_run_trains_to_the_end(tmp_path):
    """Negative control: the same command with EARLY_STOP_PATIENCE=0 trains every step, past step 60 where the run
    above stops."""
    result = _train(tmp_path / "run", *STOPPING[:-2], "--gin_param=TRAIN_STEPS=80")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _train_steps(tmp_path / "run") == [20, 40, 60, 80] and "Stopped early" not in result.stdout


class _History:
    def __init__(self, evaluations):
        self.evaluations = evaluations


def _reason(evaluations, *, patience=2, min_delta=0.0, metric="eval/accuracy", mode="max"):
    from training.observers.standard import EarlyStopping

    stopping = EarlyStopping.__new__(EarlyStopping)
    stopping.history, stopping.patience, stopping.min_delta = _History(evaluations), patience, min_delta
    stopping.metric, stopping.mode = metric, mode
    return stopping.stop_reason()


def test_the_rule_counts_evaluations_since_the_last_improvement_by_more_than_the_delta():
    assert _reason([(1, 0.5), (2, 0.6), (3, 0.6)]) is None  # One without improvement.
    assert "best 0.6000 at step 2" in _reason([(1, 0.5), (2, 0.6), (3, 0.6), (4, 0.59)])
    assert _reason([(1, 0.5), (2, 0.6), (3, 0.6), (4, 0.61)]) is None  # Improved again.
    assert _reason([(1, 0.5), (2, 0.505), (3, 0.509)], min_delta=0.01) is not None  # Gains within the delta.
    assert _reason([(1, 2.0), (2, 1.0), (3, 1.5), (4, 1.2)], metric="eval/loss", mode="min") is not None
    assert _reason([(1, 2.0), (2, 1.0), (3, 0.5)], metric="eval/loss", mode="min") is None
    assert _reason([(1, 0.5), (2, math.nan), (3, math.nan)]) is not None  # A non-finite evaluation is no gain.
    assert _reason([]) is None


def test_patience_needs_a_metric_and_evaluations(small_config):
    with pytest.raises(ConfigError, match="EARLY_STOP_PATIENCE=2 needs BEST_METRIC"):
        small_config(early_stop_patience=2, eval_every=10)
    with pytest.raises(ConfigError, match="needs evaluations during training: set EVAL_EVERY"):
        small_config(early_stop_patience=2, best_metric="eval/accuracy")
    with pytest.raises(ConfigError, match="early_stop_min_delta=-0.1 must be a number >= 0"):
        small_config(early_stop_min_delta=-0.1)
