"""TPU system initialisation behind `make_strategy('tpu')`, written from shared/notes/tpu-facts.md.

- 'local' (Colab TPU runtime, single-host TPU VM): `TPUClusterResolver(tpu='local')`, no cluster connect.
- a TPU name (pod slices, single client on worker 0): resolve the name, connect to the cluster, then initialise.

No TPU exists where this template is tested: the decisions and error paths are covered by tests up to the point
where a chip would answer.
"""

import tensorflow as tf

from training.errors import ConfigError


def make_tpu_strategy(tpu: str) -> tf.distribute.TPUStrategy:
    """Initialises the TPU system named by `tpu` ('local' or a TPU name) and returns a TPUStrategy over it."""
    if not isinstance(tpu, str) or not tpu:
        raise ConfigError(f"TPU={tpu!r}: expected 'local' (Colab, single-host TPU VM) or the name of a TPU pod slice.")
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    except (ValueError, OSError) as error:
        raise ConfigError(f"TPU={tpu!r} could not be resolved ({error}). Check the TPU name and zone with "
                          "`gcloud compute tpus tpu-vm list`, or use TPU='local' on the TPU VM itself.") from error
    if tpu != "local":
        tf.config.experimental_connect_to_cluster(resolver)
    try:
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except tf.errors.NotFoundError as error:
        raise ConfigError(f"TPU={tpu!r}: TensorFlow found no TPU ({error.message.strip()}). On Colab, pick a TPU "
                          "runtime; on a TPU VM, install requirements-tpu.txt; elsewhere use STRATEGY='auto'.") from error
    return tf.distribute.TPUStrategy(resolver)
