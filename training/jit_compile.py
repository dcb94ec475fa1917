"""experiment.jit_compile ('off', 'on', 'auto'): whether each replica's forward and backward pass runs as one XLA
computation on CPUs and GPUs.

What 'on' compiles: training/learning/step.py's forward_backward (the model call, the loss, the regularization term
and their gradients), as tf.function(jit_compile=True) inside the replica step. Not the rest, because on
TensorFlow 2.20 here:
- the cross-replica sum, the clip and apply_gradients stay outside: XLA on the whole replica step fails at 2+
  replicas (the all-reduce and the mirrored update access resources on other devices);
- the on-device loop stays outside: IteratorGetNext has no XLA kernel.
Where it cannot work, 'on' is refused before training (ConfigError, exit 2) and 'auto' chooses off:
- synchronized BatchNormalization under MirroredStrategy (at any replica count, 1 included): its batch statistics
  are all-reduced inside the forward pass, a cross-replica `merge_call` that a nested XLA function cannot hold;
- ACCUMULATE_STEPS > 1: the micro-batch loop (training/learning/accumulation.py) is not compiled.
On TPUs everything is compiled by XLA already: 'on' and 'auto' change nothing there (logged).

'auto' follows the benchmark (bench/throughput.py; docs/throughput.md, "XLA", has the table and the command): on
only where XLA trained faster in every session measured (AUTO_ON), off elsewhere; on a GPU, measure before relying
on it. The choice and its reason are logged.
"""

import logging

import keras
import tensorflow as tf

from common.errors import ConfigError
from common.settings import how_to_set, require_choice

log = logging.getLogger(__name__)

# MODEL -> (the largest replica count, the largest per-replica batch) at which 'auto' turns XLA on: where
# bench/throughput.py measured XLA faster in every session (docs/throughput.md, "XLA").
AUTO_ON = {"cnn": (1, 64)}


def is_mirrored(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` mirrors the variables (cross-replica merges in the forward pass), at any replica count."""
    return strategy.num_replicas_in_sync > 1 or isinstance(strategy, (tf.distribute.MirroredStrategy,
                                                                      tf.distribute.MultiWorkerMirroredStrategy))


def resolve(config, model: keras.Model, *, replicas: int, mirrored: bool, per_replica_batch: int,
            on_tpu: bool) -> bool:
    """Whether the training step compiles its forward and backward pass with XLA, for `config` on `replicas`
    replicas (`mirrored`: under a strategy that mirrors the variables, is_mirrored) at `per_replica_batch` examples
    per replica (`on_tpu`: the config is for TPUs, even where --preflight builds it on CPUs). A ConfigError for 'on'
    where it cannot work (see the module docstring)."""
    setting = config.jit_compile
    if setting == "off":
        return False
    if on_tpu:
        log.info("experiment.jit_compile=%r: ignored on TPUs, which compile everything with XLA.", setting)
        return False
    obstacle = _obstacle(config, model, replicas, mirrored)
    if setting == "on":
        if obstacle:
            raise ConfigError(f"experiment.jit_compile='on' cannot compile this step: {obstacle}. Use "
                              f"{how_to_set('jit_compile', 'off')} (or 'auto', which chooses off here).")
        log.info("experiment.jit_compile='on': the forward and backward pass compiled with XLA.")
        return True
    chosen, reason = _auto(config.model, replicas, per_replica_batch, obstacle)
    log.info("experiment.jit_compile='auto': %s (%s).", "on" if chosen else "off", reason)
    return chosen


def _obstacle(config, model: keras.Model, replicas: int, mirrored: bool) -> str:
    """Why XLA cannot compile this step ('' if it can)."""
    if config.accumulate_steps > 1:
        return f"ACCUMULATE_STEPS={config.accumulate_steps} (the micro-batch loop is not compiled)"
    synchronized = [layer.name for layer in model._flatten_layers(include_self=False)
                    if isinstance(layer, keras.layers.BatchNormalization) and layer.synchronized]
    if mirrored and synchronized:
        return (f"{len(synchronized)} synchronized BatchNormalization layer(s) ({synchronized[0]}, ...) under "
                f"MirroredStrategy ({replicas} replica(s)): their cross-replica statistics cannot run inside a nested "
                f"XLA function; bind {config.model}.synchronized_batch_norm=False, or STRATEGY='default' on 1 device")
    return ""


def _auto(model_name: str, replicas: int, per_replica_batch: int, obstacle: str) -> tuple[bool, str]:
    """(on?, why) for 'auto'."""
    if obstacle:
        return False, obstacle
    if model_name not in AUTO_ON:
        return False, f"MODEL={model_name!r} was not faster with XLA in bench/throughput.py, docs/throughput.md"
    max_replicas, max_batch = AUTO_ON[model_name]
    if replicas <= max_replicas and per_replica_batch <= max_batch:
        return True, (f"MODEL={model_name!r} at {replicas} replica(s) and {per_replica_batch} examples per replica "
                      "trained faster with XLA in bench/throughput.py, docs/throughput.md")
    return False, (f"MODEL={model_name!r} was faster with XLA only up to {max_replicas} replica(s) and {max_batch} "
                   "examples per replica in bench/throughput.py, docs/throughput.md")


# XLA for the per-replica forward and backward pass on CPUs/GPUs; TPUs always compile.
JIT_COMPILE = ("off", "on", "auto")


def check_settings(config) -> None:
    require_choice("jit_compile", config.jit_compile, JIT_COMPILE)
