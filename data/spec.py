"""DatasetSpec, a leaf of data/: where a dataset's examples come from (a TFDS dataset and its splits) and what is
learned from them (its task). data/registry.py names the shipped ones; data/builders.py finds their TFDS builders;
data/pipeline.py reads them."""

import dataclasses

from common.errors import ConfigError
from tasks.base import Task


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset's examples come from (a TFDS dataset and its splits) and what is learned from them (`task`)."""

    tfds_name: str
    train_split: str
    eval_split: str
    task: Task  # Features, targets, preprocessing, loss, metrics and serving: tasks/.
    module: str | None = None  # Module to import so TFDS registers the builder (bundled builders only).
    # Train order: None = in host memory when the encoded split is under 1 GiB, else read by shard file
    # (data/shard_stream.py); True/False force one. Large datasets should say True.
    read_by_shard: bool | None = None
    # The DATASET name it was found by ('digits', 'tfds:my_data'); set by data/registry.get_dataset_spec. Error hints
    # tell `python -m stage --dataset=` to take it.
    name: str | None = None

    def stage_name(self) -> str:
        """What `python -m stage --dataset=` takes to prepare this dataset."""
        return self.name or f"tfds:{self.tfds_name}"


def check_task_features(spec: DatasetSpec, features, *, dataset: str | None = None) -> None:
    """A ConfigError unless the dataset's `features` have every feature the task reads."""
    missing = [key for key in spec.task.keys if key not in features]
    if missing:
        dataset = dataset or spec.stage_name()
        raise ConfigError(f"DATASET={dataset!r}: its task {type(spec.task).__name__} reads the feature(s) "
                          f"{', '.join(map(repr, missing))}, which {spec.tfds_name!r} does not have. Its features are "
                          f"{', '.join(map(repr, features.keys()))}: set the task's keys to them (e.g. label_key=...) "
                          "where the dataset is registered (data/registry.py).")
