"""TPU system initialisation behind `make_strategy('tpu')`.

- TPU='local' (Colab TPU runtime, single-host TPU VM): `TPUClusterResolver(tpu='local')`, no cluster connect; this
  process drives the local chips, so TPU_LOAD_LIBRARY must not be 0.
- a TPU name (pod slices): TensorFlow is single-client. The script runs on worker 0 only, with TPU_LOAD_LIBRARY=0 set
  before Python starts (the chips belong to the TPU servers on every host); resolve the name, connect, initialise.
- `grpc://host:port`: a TPU node or a TPU server you address directly; treated like a name.

Every failure ends in bounded time: wrong settings and unknown names raise ConfigError (exit 2) before anything
connects, and a connect or initialisation that never answers ends the process after `startup_timeout_seconds`
(tpu_utils/deadline.py). No TPU exists where this template is tested: the decisions and error paths are covered by
tests up to the point where a chip would answer.
"""

import importlib.metadata
import logging
import os
import re

import tensorflow as tf

from common.errors import ConfigError
from tpu_utils.deadline import exit_if_stuck
from tpu_utils.tpu.facts import gather_facts
from tpu_utils.tpu.startup import PJRT_ENV, decide

log = logging.getLogger(__name__)

# Cloud TPU names are GCP resource names: a lowercase letter, then lowercase letters, digits and hyphens (<= 63).
_TPU_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_GRPC_ADDRESS = re.compile(r"grpc://[^\s:/]+:\d+")


def check_tpu_setting(tpu, environ=os.environ) -> None:
    """ConfigError unless `tpu` is well formed and TPU_LOAD_LIBRARY (read by TF at import) suits it."""
    if not isinstance(tpu, str) or not (tpu == "local" or _TPU_NAME.fullmatch(tpu) or _GRPC_ADDRESS.fullmatch(tpu)):
        raise ConfigError(f"TPU={tpu!r}: expected 'local' (Colab, single-host TPU VM), the name of a TPU pod slice "
                          "(lowercase letters, digits and hyphens, as in `gcloud compute tpus tpu-vm list`), or "
                          "'grpc://host:port'.")
    load_library = environ.get("TPU_LOAD_LIBRARY")
    if tpu == "local" and load_library == "0":
        raise ConfigError("TPU='local' but TPU_LOAD_LIBRARY=0 is set, which keeps TensorFlow off the local TPU "
                          "chips. Unset it (`unset TPU_LOAD_LIBRARY`), or set TPU to the pod slice's name.")
    if tpu != "local" and load_library != "0":
        raise ConfigError(f"TPU={tpu!r} (a pod slice): this process must leave the chips to the TPU servers on each "
                          "host. Start it with TPU_LOAD_LIBRARY=0 in the environment (it is read when TensorFlow "
                          "loads: `TPU_LOAD_LIBRARY=0 python train.py ...`; scripts/tpu_vm.py sets it), on worker 0 "
                          f"only. (TPU_LOAD_LIBRARY is {load_library!r}.)")


def software_versions() -> dict:
    """Versions that matter when a TPU run misbehaves: TensorFlow, Keras, tensorflow-tpu and libtpu."""
    versions = {"tensorflow": tf.__version__}
    for package in ("keras", "tensorflow-tpu", "libtpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def describe_topology(topology) -> str:
    """One line about the TPU system `initialize_tpu_system` returned (a tf.tpu.experimental.Topology)."""
    hosts, per_host = topology.num_tasks, topology.num_tpus_per_task
    return (f"{hosts} host(s) x {per_host} TPU core(s) = {hosts * per_host} cores, mesh shape "
            f"{list(topology.mesh_shape)}")


def missing_startup_variables(environ=os.environ) -> str:
    """'' if this host's TPU start-up (tpu_utils/tpu/startup.py) is in effect, else what is missing and the fix.

    TensorFlow reads the PJRT variables when it is imported, so by now they can only be checked, not set.
    """
    try:
        decision = decide(gather_facts(environ))
    except ValueError as error:  # A bad TPU_RUNTIME.
        raise ConfigError(str(error)) from error
    missing = [key for key in PJRT_ENV if decision.runtime == "pjrt" and not environ.get(key)]
    if not missing:
        return ""
    return (f"{' and '.join(missing)} were not set when TensorFlow was imported, and this "
            f"{decision.generation or 'TPU'} needs the PJRT runtime: call "
            "tpu_utils.tpu.startup.prepare_tpu_environment() before anything imports TensorFlow (train.py does), or "
            "`eval \"$(python -m tpu_utils.tpu.startup)\"` before starting Python.")


def make_tpu_strategy(tpu: str, *, startup_timeout_seconds: int = 300) -> tf.distribute.TPUStrategy:
    """Initialises the TPU system named by `tpu` and returns a TPUStrategy over all its cores."""
    check_tpu_setting(tpu)
    log.info("Versions: %s", ", ".join(f"{name} {version}" for name, version in software_versions().items()))
    missing = missing_startup_variables()
    if missing:
        log.warning("TPU start-up: %s", missing)
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    except Exception as error:  # noqa: BLE001 - URLError, HttpError, ValueError...: all mean "no such TPU here".
        raise ConfigError(f"TPU={tpu!r} could not be resolved ({type(error).__name__}: {error}). Check the name and "
                          "zone with `gcloud compute tpus tpu-vm list --zone=ZONE` and run on that TPU's worker 0, "
                          "or use TPU='local' on a single-host TPU VM or Colab.") from error
    with exit_if_stuck(startup_timeout_seconds, f"TPU {tpu!r} to connect and initialise",
                       "Check that the TPU is READY (`gcloud compute tpus tpu-vm describe`), that this is its worker "
                       "0, and that no other process holds the chips; or raise experiment.startup_timeout_seconds."):
        if tpu != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        try:
            topology = tf.tpu.experimental.initialize_tpu_system(resolver)
        except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as error:
            raise ConfigError(f"TPU={tpu!r}: TensorFlow found no usable TPU ({error.message.strip()}). "
                              + (missing or "On Colab, pick a TPU runtime (Runtime > Change runtime type); on a TPU "
                                 "VM, install requirements-tpu.txt and check that no other process uses the TPU; "
                                 "elsewhere use STRATEGY='auto'.")) from error
    log.info("TPU system: %s", describe_topology(topology))
    return tf.distribute.TPUStrategy(resolver)
