"""TF_CONFIG is validated before MultiWorkerMirroredStrategy sees it: errors name the field, exit code 2."""

import json

import pytest

from common.errors import ConfigError
from tpu_utils.strategy import make_strategy
from tpu_utils.tf_config import parse_tf_config

TWO_WORKERS = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}


@pytest.mark.parametrize("cluster, task, is_chief, num_workers", [
    (TWO_WORKERS, {"type": "worker", "index": 0}, True, 2),  # Worker 0 acts as chief.
    (TWO_WORKERS, {"type": "worker", "index": 1}, False, 2),
    ({"chief": ["127.0.0.1:2221"], **TWO_WORKERS}, {"type": "chief", "index": 0}, True, 3),
    ({"chief": ["127.0.0.1:2221"], **TWO_WORKERS}, {"type": "worker", "index": 0}, False, 3),
])
def test_valid_configs_name_the_chief(cluster, task, is_chief, num_workers):
    parsed = parse_tf_config(json.dumps({"cluster": cluster, "task": task}))
    assert (parsed.is_chief, parsed.num_workers, parsed.type, parsed.index) == (is_chief, num_workers, task["type"],
                                                                                 task["index"])


@pytest.mark.parametrize("text, message", [
    (None, "needs the TF_CONFIG environment variable"),
    ("{cluster: 1}", "TF_CONFIG is not valid JSON"),
    ("[]", "must be a JSON object"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), "TF_CONFIG['cluster'] must map job names"),
    (json.dumps({"cluster": {"ps": ["h:1"]}, "task": {"type": "ps", "index": 0}}), "job 'ps'"),
    (json.dumps({"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}), "must be a non-empty list"),
    (json.dumps({"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}}),
     "expected 'host:port'"),
    (json.dumps({"cluster": {"chief": ["a:1", "b:2"]}, "task": {"type": "chief", "index": 0}}), "there is one chief"),
    (json.dumps({"cluster": {"evaluator": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}), "nobody would train"),
    (json.dumps({"cluster": TWO_WORKERS}), "TF_CONFIG['task'] must be"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "chief", "index": 0}}), "['task']['type']='chief' is not"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 2}}),
     "['task']['index']=2 is out of range"),
    (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": "0"}}), "['task']['index']='0'"),
])
def test_bad_configs_are_config_errors_that_name_the_field(text, message):
    with pytest.raises(ConfigError) as error:
        parse_tf_config(text)
    assert message in str(error.value)


def test_the_strategy_validates_tf_config_before_constructing(monkeypatch):
    """A bad TF_CONFIG never reaches the constructor (which would wait for peers that do not exist)."""
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 5}}))
    with pytest.raises(ConfigError, match="out of range"):
        make_strategy("multi_worker_mirrored")
