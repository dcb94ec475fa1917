"""TF_CONFIG validation for STRATEGY='multi_worker_mirrored', before TensorFlow acts on it.

TF_CONFIG (JSON) names the cluster and this process's task:
  {"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, "task": {"type": "worker", "index": 0}}
A mistake there otherwise surfaces as a hang in the strategy's constructor or a gRPC error far from its cause; here
it is a ConfigError (exit 2) that names the field. The chief is task 'chief', or worker 0 when there is none.
"""

import dataclasses
import json

from common.errors import ConfigError

_JOBS = ("chief", "worker", "evaluator")


@dataclasses.dataclass(frozen=True)
class Task:
    type: str
    index: int
    num_workers: int  # chief + workers: the processes that train
    is_chief: bool


def parse_tf_config(text: str | None) -> Task:
    """Validates TF_CONFIG's text and returns this process's task."""
    if not text:
        raise ConfigError("STRATEGY='multi_worker_mirrored' needs the TF_CONFIG environment variable (the cluster "
                          "and this worker's task), set on every worker before it starts; or set STRATEGY='mirrored' "
                          "for one machine.")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({error}): {text[:200]!r}") from error
    if not isinstance(config, dict):
        raise ConfigError(f"TF_CONFIG must be a JSON object with 'cluster' and 'task'; got {text[:200]!r}.")
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError("TF_CONFIG['cluster'] must map job names to address lists, e.g. "
                          '{"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}; got ' f"{cluster!r}.")
    for job, addresses in cluster.items():
        if job not in _JOBS:
            raise ConfigError(f"TF_CONFIG['cluster'] has job {job!r}; MultiWorkerMirroredStrategy uses "
                              f"{', '.join(map(repr, _JOBS))} (parameter servers are not supported).")
        if not isinstance(addresses, list) or not addresses:
            raise ConfigError(f"TF_CONFIG['cluster'][{job!r}] must be a non-empty list of 'host:port'; got "
                              f"{addresses!r}.")
        for address in addresses:
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"TF_CONFIG['cluster'][{job!r}] has {address!r}; expected 'host:port'.")
    if len(cluster.get("chief", [])) > 1:
        raise ConfigError(f"TF_CONFIG['cluster']['chief'] lists {len(cluster['chief'])} addresses; there is one "
                          "chief (or none, and worker 0 acts as chief).")
    if "chief" not in cluster and "worker" not in cluster:
        raise ConfigError("TF_CONFIG['cluster'] has no 'chief' and no 'worker' job: nobody would train.")
    if not isinstance(task, dict):
        raise ConfigError(f"TF_CONFIG['task'] must be {{'type': ..., 'index': ...}}; got {task!r}.")
    task_type, index = task.get("type"), task.get("index")
    if task_type not in cluster:
        raise ConfigError(f"TF_CONFIG['task']['type']={task_type!r} is not a job of the cluster "
                          f"({', '.join(map(repr, cluster))}).")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[task_type]):
        raise ConfigError(f"TF_CONFIG['task']['index']={index!r} is out of range: job {task_type!r} has "
                          f"{len(cluster[task_type])} address(es), so 0..{len(cluster[task_type]) - 1}.")
    is_chief = task_type == "chief" or (task_type == "worker" and index == 0 and "chief" not in cluster)
    return Task(type=task_type, index=index, num_workers=len(cluster.get("chief", [])) + len(cluster.get("worker", [])),
                is_chief=is_chief)
