"""docs/make_it_yours.md stays true: every code block runs, in order, and each extension then trains, passes the
float64 replica-invariance check where the page says to run it, and shows up where the page says it does."""

import json
import os
import re

import pytest

from helpers import REPO_ROOT
from training import replica_invariance

GUIDE = os.path.join(REPO_ROOT, "docs", "make_it_yours.md")
MLP = "configs/experiments/digits_mlp.gin"


def _code_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", open(GUIDE).read(), flags=re.S)


@pytest.fixture(scope="module")
def guide():
    """Runs the guide's code blocks once (gin refuses to register a configurable twice); the registries they extend
    are restored after the module's tests."""
    from data import registry as datasets
    from models import registry as models
    from training.learning import losses, metrics, schedules
    from training.observers import standard as observers

    with pytest.MonkeyPatch.context() as monkeypatch:
        for module, name in ((models, "MODELS"), (losses, "LOSSES"), (metrics, "METRICS"),
                             (schedules, "SCHEDULES"), (datasets, "DATASETS"), (observers, "OBSERVERS")):
            monkeypatch.setattr(module, name, dict(getattr(module, name)))
        # Functions that read a registry look it up in their module at call time: they see the copies.
        blocks = _code_blocks()
        assert len(blocks) == 8, ("a model and its registration, a loss, a metric, a schedule, a task and its "
                                  "entry, an observer")
        namespace = {"__name__": "make_it_yours"}  # One namespace: a registration block uses the block before.
        for block in blocks:
            exec(compile(block, GUIDE, "exec"), namespace)
        yield


def _invariance(*params: str) -> int:
    return replica_invariance.main(["replica_invariance", f"--gin_file={MLP}", "--replicas=1,2,4",
                                    *[f"--gin_param={param}" for param in params]])


def _train(tmp_path, *params: str) -> dict:
    from training import config_files, experiment

    config_files.parse([MLP], ["TRAIN_STEPS=300", "EVAL_EVERY=0", "CHECKPOINT_EVERY=0", *params],
                       search_path=REPO_ROOT)
    model_dir = str(tmp_path / "run")
    experiment.run(model_dir=model_dir)
    return json.load(open(os.path.join(model_dir, "metrics.json")))


@pytest.mark.slow
def test_the_guides_model_loss_and_task_pass_the_invariance_check(data_dir, guide, capsys):
    assert _invariance("MODEL='wide_mlp'", "wide_mlp.dropout_rate=0.2") == 0
    assert _invariance("experiment.loss='focal'") == 0
    assert _invariance("DATASET='digits_parity'") == 0
    assert capsys.readouterr().out.count("PASS") == 3


@pytest.mark.slow
def test_the_guides_extensions_train_and_report(data_dir, guide, tmp_path):
    metrics = _train(tmp_path, "MODEL='wide_mlp'", "experiment.loss='focal'", "experiment.lr_schedule='step_decay'",
                     "experiment.metrics=['accuracy', 'macro_f1']")
    assert metrics["eval"]["accuracy"] > 0.9 and 0.9 < metrics["eval"]["macro_f1"] <= 1.0
    assert "macro_f1" in metrics["train"]


def test_the_guides_task_learns_parity_and_serves_its_class_names(data_dir, guide, tmp_path):
    import tensorflow as tf

    metrics = _train(tmp_path, "DATASET='digits_parity'")
    assert metrics["eval"]["accuracy"] > 0.9  # Chance is 0.5.
    served = tf.saved_model.load(str(tmp_path / "run" / "export" / "300"))
    outputs = served.signatures["serving_default"](images=tf.zeros([2, 8, 8, 1], tf.uint8))
    assert set(outputs["class_names"].numpy()) <= {b"even", b"odd"}


def test_the_guides_step_decay_schedule_decays_at_its_boundaries(guide):
    from training.learning.schedules import SCHEDULES

    schedule = SCHEDULES["step_decay"](0.1, 1000)
    assert [round(float(schedule(step)), 6) for step in (0, 499, 501, 751)] == [0.1, 0.1, 0.01, 0.001]


def test_the_guides_observer_writes_its_csv_without_an_edit_of_the_controller(data_dir, guide, tmp_path):
    """The observer of "Watch it your way" runs after the standard ones: one row per loop, the loss of each loop as
    metrics.jsonl records it. An unknown observer name is exit 2 naming the known ones (the negative control)."""
    from common.errors import ConfigError

    _train(tmp_path, "experiment.observers=['loss_csv']", "STEPS_PER_LOOP=100")
    rows = open(tmp_path / "run" / "losses.csv").read().splitlines()
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    train_losses = {record["step"]: record["metrics"]["loss"] for record in records if record["kind"] == "train"}
    assert rows[0] == "step,loss,learning_rate" and [int(row.split(",")[0]) for row in rows[1:]] == [100, 200, 300]
    for row in rows[1:]:
        step, loss, _ = row.split(",")
        assert abs(float(loss) - train_losses[int(step)]) < 1e-6
    with pytest.raises(ConfigError, match=r"Unknown experiment.observers entry 'loss_cvs' \(did you mean "
                                          r"'loss_csv'\?\)\. Known observers: .*csv"):
        _train(tmp_path / "other", "experiment.observers=['loss_cvs']")
