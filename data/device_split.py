"""The train split kept on every replica's device, each step's batch gathered inside the compiled training loop.

For splits that fit in memory the tf.data pipeline (data/pipeline.py) draws each per-replica batch on the host:
shuffle the positions, gather the examples, prepare them (augment, scale), then copy the batch to the device. On
fast models that host work, not the model, limits the step rate, and more so with several replicas on the same
cores. Here the decoded split is copied once to every replica's device (a non-trainable mirrored variable per
feature, never checkpointed) and the same function, pipeline.examples_at, runs inside the compiled loop on the
positions of the current step: no tf.data on the critical path at all.

Same batches as the tf.data pipeline, bit for bit, on one host: global step s trains on stream positions
[s * G, (s + 1) * G) and replica r of R takes [s * G + r * G/R, s * G + (r + 1) * G/R), which is how
distribute_datasets_from_function hands out consecutive per-replica batches. The order is positioned by the step
counter, so resume stays exact. On several hosts the union of a step's batches is the same G examples (each
replica's share differs from the tf.data pipeline's, which changes nothing in the summed gradients).

`experiment.train_data_on_device`: 'auto' (the default) uses it when it can help and is known to work: the split is
read into memory anyway, every feature the task keeps is numeric (strings cannot live on an accelerator), it fits on
the device, and one process runs the job (several workers would each receive every other worker's copy at start; a
TPU pod slice has one client, so it counts as one). Fits: on CPUs and GPUs at most DEVICE_LIMIT_BYTES per replica;
on a TPU the split plus twice the model's state (weights and optimizer slots, then gradients and the step's copies)
within half of TPU_REPLICA_HBM_BYTES, the smallest memory a TPU replica has, the other half left to activations and
XLA's buffers. TPUs run only XLA: the epoch permutation (common/keyed_random.py) is integer ops that XLA compiles, and
the CPU preflight compiles the draw with XLA. 'always' makes any reason it cannot be used an error; 'never' keeps
the tf.data pipeline.
"""

import tensorflow as tf
import tensorflow_datasets as tfds

from common.errors import ConfigError
from common.settings import require_choice
from data import builders, pipeline
from data.spec import DatasetSpec

DEVICE_LIMIT_BYTES = 512 << 20  # Per replica (its device holds one copy): CIFAR-10 decoded takes 150 MB.
# HBM per TPU replica: 8 GiB on a v2 core (the least of any Cloud TPU), 16 GiB on a v3 core and a v5e chip, 32 GiB
# on a v4 or v6e chip, 95 GiB on a v5p chip.
TPU_REPLICA_HBM_BYTES = 8 << 30


def split_bytes(spec: DatasetSpec, builder: tfds.core.DatasetBuilder) -> int:
    """What one device's copy of the decoded train split takes (0 without split metadata: TFDS's mock data)."""
    return pipeline.in_memory_bytes(spec, builder) if spec.train_split in builder.info.splits else 0


def state_bytes(variables) -> int:
    """What `variables` (the model's and the optimizer's) take on one replica."""
    return sum(variable.shape.num_elements() * tf.as_dtype(variable.dtype).size for variable in variables)


def _over_budget(size: int, state: int, *, on_tpu: bool) -> str | None:
    mib = lambda count: f"{count / 2**20:,.0f} MiB"  # noqa: E731
    if not on_tpu:
        return (f"the decoded train split takes {mib(size)}, over {mib(DEVICE_LIMIT_BYTES)} per replica"
                if size > DEVICE_LIMIT_BYTES else None)
    if size + 2 * state > TPU_REPLICA_HBM_BYTES // 2:
        return (f"the decoded train split ({mib(size)}) and twice the model's state ({mib(state)}) take "
                f"{mib(size + 2 * state)}, over half of the {mib(TPU_REPLICA_HBM_BYTES)} the smallest TPU replica has")
    return None


def unusable_because(spec: DatasetSpec, builder: tfds.core.DatasetBuilder, *, on_tpu: bool,
                     state: int = 0) -> str | None:
    """Why the train split cannot be kept on the devices (None: it can). Reads metadata only. `on_tpu`: the run is
    (or, for --preflight on CPU, will be) on a TPU; `state`: the bytes of the model's and optimizer's variables
    (state_bytes), which share a TPU replica's memory with the split."""
    if pipeline.reads_by_shard(spec, builder):
        return "the train split is read by shard file (too large for memory)"
    over = _over_budget(split_bytes(spec, builder), state, on_tpu=on_tpu)
    if over:
        return over
    element = builders.encoded_split(spec, builder, spec.train_split).element_spec
    strings = sorted(key for key, feature in element.items() if feature.dtype == tf.string)
    if strings:
        return f"feature(s) {strings} are strings (encoded images or text), which only the host can decode"
    return None


def host_reason(setting: str, spec: DatasetSpec, builder: tfds.core.DatasetBuilder, *, on_tpu: bool,
                multi_worker: bool, state: int = 0, data_service: bool = False) -> str | None:
    """Why the training batches are read by tf.data on the host for `setting` ('auto', 'always', 'never'); None when
    the split is kept on the devices. 'always' with a reason it cannot is a ConfigError naming the reason.
    `data_service`: DATA_SERVICE is set (the services make the batches)."""
    if setting == "never":
        return "experiment.train_data_on_device='never'"
    reason = ("DATA_SERVICE is set: tf.data services make the batches" if data_service else
              unusable_because(spec, builder, on_tpu=on_tpu, state=state))
    if setting == "always" and reason:
        raise ConfigError(f"experiment.train_data_on_device='always' cannot be honoured for {spec.tfds_name!r}: "
                          f"{reason}. Set experiment.train_data_on_device='auto' (or 'never') to read batches with "
                          "tf.data on the host.")
    if reason is None and setting == "auto" and multi_worker:
        reason = ("several workers run the job (each would receive every other worker's copy at start; "
                  "experiment.train_data_on_device='always' keeps it on the devices anyway)")
    return reason


def wanted(setting: str, spec: DatasetSpec, builder: tfds.core.DatasetBuilder, **options) -> bool:
    """Whether to keep the train split on the devices (host_reason gives none not to)."""
    return host_reason(setting, spec, builder, **options) is None


class DeviceSplit:
    """The decoded train split on every replica's device; `replica_batch(step)` is one replica's batch of `step`.

    Pass it where the training loop takes an iterator (tpu_utils/loop.py): the loop calls replica_batch inside
    strategy.run with the global step of each iteration. Build it once per Trainer: the loop is traced for it.
    """

    def __init__(self, spec: DatasetSpec, builder: tfds.core.DatasetBuilder, strategy: tf.distribute.Strategy, *,
                 global_batch_size: int, seed: int):
        self._spec, self._builder, self._seed = spec, builder, seed
        self._num_examples = builders.split_size(builder, spec.train_split)
        pipeline.check_batch_fits(spec, self._num_examples, global_batch_size)
        self._global_batch_size = global_batch_size
        self._per_replica = global_batch_size // strategy.num_replicas_in_sync
        examples = pipeline.decoded_train_split(spec, builder)
        with strategy.scope():  # One copy per replica's device; not tracked by any checkpoint.
            self._examples = {key: tf.Variable(value, trainable=False, name=f"train_split_{key}")
                              for key, value in examples.items()}
        self.bytes_per_replica = state_bytes(self._examples.values())  # What each replica's device keeps.

    def replica_batch(self, step: tf.Tensor) -> tuple:
        """(features, targets, positions) of this replica's share of global step `step` (int64); call it in replica
        context."""
        replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
        start = step * self._global_batch_size + replica * self._per_replica
        positions = start + tf.range(self._per_replica, dtype=tf.int64)
        return pipeline.examples_at(self._spec, self._builder, self._examples, positions,
                                    num_examples=self._num_examples, seed=self._seed)


# Where training batches are drawn: on the devices when it helps, always, or by tf.data.
TRAIN_DATA_ON_DEVICE = ("auto", "always", "never")


def check_settings(config) -> None:
    require_choice("train_data_on_device", config.train_data_on_device, TRAIN_DATA_ON_DEVICE)
