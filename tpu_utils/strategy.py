"""Strategy selection: the one place that turns `STRATEGY`/`VIRTUAL_DEVICES`/`TPU` into a `tf.distribute.Strategy`.

Nothing else in the template touches device set-up, TPU resolvers or TF_CONFIG. Call `make_strategy` before any
other TensorFlow work in the process: virtual CPU devices can only be configured before TF initialises its devices.
"""

import os

import tensorflow as tf

from common.errors import ConfigError
from common.registry import meant_name
from common.settings import require_int
from tpu_utils.deadline import exit_if_stuck
from tpu_utils.tpu import facts as tpu_facts

STRATEGY_NAMES = ("auto", "default", "mirrored", "multi_worker_mirrored", "tpu")

def make_strategy(name: str, *, virtual_devices: int = 0, tpu: str = "local",
                  startup_timeout_seconds: int = 300) -> tf.distribute.Strategy:
    """Returns the strategy named `name` (one of STRATEGY_NAMES).

    Args:
      name: 'auto' picks 'tpu' when a TPU is attached, else 'mirrored' over all local GPUs, else 'default'.
      virtual_devices: with 'mirrored' on a CPU-only host, split the CPU into this many devices (0 = off). Used to
        simulate replicas on a laptop or in CI; an error with any other strategy.
      tpu: 'local' (Colab, single-host TPU VM) or the TPU name of a pod slice.
      startup_timeout_seconds: how long to wait for the other workers of TF_CONFIG, or a TPU, before exiting.
    """
    if name not in STRATEGY_NAMES:
        meant = meant_name(name, STRATEGY_NAMES)
        raise ConfigError(f"Unknown STRATEGY={name!r}{f' (did you mean {meant!r}?)' if meant else ''}. Expected "
                          f"one of {', '.join(map(repr, STRATEGY_NAMES))}; set it with "
                          "--gin_param=\"STRATEGY='mirrored'\".")
    if not isinstance(virtual_devices, int) or isinstance(virtual_devices, bool) or virtual_devices < 0:
        raise ConfigError(f"VIRTUAL_DEVICES={virtual_devices!r} must be an int >= 0 (0 = off).")
    if name == "auto":
        name = _detect_strategy_name()
    if virtual_devices and name != "mirrored":
        raise ConfigError(f"VIRTUAL_DEVICES={virtual_devices} only works with STRATEGY='mirrored' (got {name!r}): it "
                          "splits the CPU into devices to simulate replicas. Set STRATEGY='mirrored' or "
                          "VIRTUAL_DEVICES=0.")
    return _BUILDERS[name](virtual_devices=virtual_devices, tpu=tpu, startup_timeout_seconds=startup_timeout_seconds)


def local_tpu_attached() -> bool:
    """True when this host exposes TPU chips (a TPU VM or Colab TPU runtime); file checks, no network."""
    return tpu_facts.local_tpu_attached()


def _detect_strategy_name() -> str:
    if local_tpu_attached() or os.environ.get("TPU_NAME"):
        return "tpu"
    if tf.config.list_physical_devices("GPU"):
        return "mirrored"
    return "default"


def _default(*, virtual_devices, tpu, startup_timeout_seconds):
    del virtual_devices, tpu, startup_timeout_seconds
    return tf.distribute.get_strategy()


def _mirrored(*, virtual_devices, tpu, startup_timeout_seconds):
    del tpu, startup_timeout_seconds
    if not virtual_devices:
        return tf.distribute.MirroredStrategy()
    if tf.config.list_physical_devices("GPU"):
        raise ConfigError(f"VIRTUAL_DEVICES={virtual_devices} splits the CPU, but this host has GPUs: use "
                          "VIRTUAL_DEVICES=0 to mirror over the GPUs.")
    configure_virtual_cpus(virtual_devices)
    # ReductionToOneDevice: the default collective ops on CPU cannot be reused with another replica count in the
    # same process ("joining a group with size 4, but that group has size 2"), which the invariance check needs.
    return tf.distribute.MirroredStrategy(devices=[f"/cpu:{index}" for index in range(virtual_devices)],
                                          cross_device_ops=tf.distribute.ReductionToOneDevice())


def configure_virtual_cpus(count: int) -> None:
    """Splits the first CPU into at least `count` logical devices; must run before TF initialises its devices."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    existing = tf.config.get_logical_device_configuration(cpu)
    if existing is not None and len(existing) >= count:
        return
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
        have = len(tf.config.list_logical_devices("CPU"))
        raise ConfigError(f"VIRTUAL_DEVICES={count}: TensorFlow already initialised {have} CPU device(s) in this "
                          "process, so it cannot be split any more. Create the strategy before any other "
                          f"TensorFlow work ({error}).") from error


def _multi_worker_mirrored(*, virtual_devices, tpu, startup_timeout_seconds):
    del virtual_devices, tpu
    from tpu_utils.tf_config import parse_tf_config

    task = parse_tf_config(os.environ.get("TF_CONFIG"))  # A clear error now rather than a hang in the constructor.
    # The constructor blocks until every worker of TF_CONFIG has connected, forever if one never starts.
    with exit_if_stuck(startup_timeout_seconds, f"the {task.num_workers} workers of TF_CONFIG to connect "
                       f"(this is {task.type} {task.index})",
                       "Start every worker listed in TF_CONFIG, check that their host:port addresses are reachable "
                       "from each other, or raise experiment.startup_timeout_seconds."):
        return tf.distribute.MultiWorkerMirroredStrategy()


def io_device_for(strategy: tf.distribute.Strategy, path: str) -> str | None:
    """The device that must do checkpoint/SavedModel I/O for `path`: '/job:localhost' for a local path under a
    TPUStrategy (the TPU workers cannot see this host's disk), else None (default)."""
    if isinstance(strategy, tf.distribute.TPUStrategy) and not path.startswith("gs://"):
        return "/job:localhost"
    return None


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    """Whether replicas live in more than one process that must agree on host-side decisions (e.g. stopping)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
        return False
    cluster = resolver.cluster_spec().as_dict()
    return len(cluster.get("chief", [])) + len(cluster.get("worker", [])) > 1


def input_hosts(strategy: tf.distribute.Strategy) -> int:
    """Hosts whose CPUs run the input pipelines of this process's strategy: a TPU pod slice's hosts (the one client
    places a pipeline on each), else 1 (every other strategy's pipelines run in this process)."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return int(getattr(strategy.extended, "num_hosts", 1) or 1)
    return 1


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the run directory: always, except on the non-chief workers of a multi-worker job.

    The chief is TF_CONFIG's 'chief' task, or worker 0 when there is none. (TPU pods are single-client: the one
    Python process, on worker 0, is the chief.)
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None or \
            not resolver.task_type:
        return True
    if resolver.task_type == "chief":
        return True
    return resolver.task_type == "worker" and resolver.task_id == 0 and \
        "chief" not in resolver.cluster_spec().as_dict()


def _tpu(*, virtual_devices, tpu, startup_timeout_seconds):
    del virtual_devices
    from tpu_utils.tpu import initialize as tpu_init  # Imported lazily: only TPU runs need the resolver machinery.

    return tpu_init.make_tpu_strategy(tpu, startup_timeout_seconds=startup_timeout_seconds)


_BUILDERS = {
    "default": _default,
    "mirrored": _mirrored,
    "multi_worker_mirrored": _multi_worker_mirrored,
    "tpu": _tpu,
}


def check_settings(config) -> None:
    """VIRTUAL_DEVICES, experiment.target_replicas and experiment.startup_timeout_seconds (STRATEGY itself, and
    VIRTUAL_DEVICES with it, when the strategy is made)."""
    for name in ("virtual_devices", "target_replicas"):
        require_int(name, getattr(config, name), minimum=0, example=0)
    require_int("startup_timeout_seconds", config.startup_timeout_seconds, minimum=1, example=300)
