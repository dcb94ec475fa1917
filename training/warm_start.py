"""Warm start (INIT_FROM): a new run's model variables loaded from another run's checkpoint or a Keras weights file.

Used only when model_dir has no checkpoint of its own (training/controller.py): a resumed fine-tune continues from
its own checkpoint and never re-initialises. Only model variables are loaded (weights and BatchNormalization
statistics): the optimizer state (momentum, Adam moments, its step count) is never taken from the source, and the
run's step starts at 0.

Sources (local or gs://):
- a run directory (the newest intact checkpoint in its checkpoints/), a checkpoints/ folder, or a prefix
  `.../checkpoints/ckpt-N`: variables are found by their place in the checkpoint's object graph (the path of
  attributes from the model, e.g. `_operations/10/_kernel`), so the source must be a model of the same structure;
  a new head of another size is a shape mismatch to exclude with experiment.init_exclude;
- a Keras weights file (`model.save_weights('x.weights.h5')`): found by Keras' own layout of that file
  (`layers/dense/vars/0`), i.e. again by structure, not by layer names.

experiment.init_include / init_exclude choose the variables by their Keras path (training/variable_selection.py).
The run logs a table of every model variable: restored, skipped (excluded or not in the source) or shape-mismatched.
Nothing restored, or a shape mismatch not excluded, is a ConfigError naming the variables.
"""

import collections
import logging
import os
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from common.errors import ConfigError
from common.settings import how_to_set
from common.storage_paths import join
from training.run_directory.checkpoints import checkpoint_steps, verify
from training.run_directory.layout import CHECKPOINTS
from training.variable_selection import check_patterns, select

log = logging.getLogger(__name__)

WEIGHTS_SUFFIX = ".weights.h5"


def resolve(init_from: str) -> tuple[str, str]:
    """('checkpoint', prefix) or ('weights', file) for INIT_FROM; a ConfigError when it is neither."""
    if init_from.endswith(WEIGHTS_SUFFIX):
        if not tf.io.gfile.exists(init_from):
            raise ConfigError(f"INIT_FROM={init_from!r}: no such weights file. Give an existing .weights.h5 file, a "
                              "run's model_dir or a checkpoint prefix (.../checkpoints/ckpt-N).")
        return "weights", init_from
    if tf.io.gfile.exists(init_from + ".index"):
        return "checkpoint", init_from
    for folder in (join(init_from, CHECKPOINTS), init_from):
        steps = checkpoint_steps(folder) if tf.io.gfile.isdir(folder) else []
        for step in reversed(steps):
            prefix = join(folder, f"ckpt-{step}")
            problem = verify(prefix)
            if problem is None:
                return "checkpoint", prefix
            log.warning("INIT_FROM: skipping the damaged checkpoint %s (%s).", prefix, problem)
        if steps:
            raise ConfigError(f"INIT_FROM={init_from!r}: no checkpoint in {folder} is intact (see the warnings "
                              "above). Give another checkpoint prefix (.../checkpoints/ckpt-N).")
    raise ConfigError(f"INIT_FROM={init_from!r} is not a run directory with checkpoints/, a checkpoint prefix "
                      "(.../checkpoints/ckpt-N) or a Keras weights file (.weights.h5); fix the path, or set "
                      "INIT_FROM=None to start from random weights.")


def _trackable_paths(root) -> dict[int, str]:
    """{id(variable): its object-graph path from `root`} for every object reachable as checkpoint dependencies,
    breadth first in dependency order: the order tf.train.Checkpoint numbers and names them in."""
    paths, seen, queue = {}, {id(root)}, collections.deque([(root, "")])
    while queue:
        node, path = queue.popleft()
        children = node._trackable_children(save_type="checkpoint") if hasattr(node, "_trackable_children") else {}
        for name, child in children.items():
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_path = f"{path}/{name}" if path else name
            paths[id(child)] = child_path
            queue.append((child, child_path))
    return paths


def _checkpoint_values(prefix: str) -> dict[str, np.ndarray]:
    """{object-graph path below the checkpoint's `model`: value} of every variable in the checkpoint at `prefix`."""
    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    model = next((child.node_id for child in graph.nodes[0].children if child.local_name == "model"), None)
    if model is None:
        raise ConfigError(f"INIT_FROM: the checkpoint {prefix} holds no model (it was not written by a run of this "
                          "template); give a run's checkpoint or a .weights.h5 file of the model.")
    values, seen, queue = {}, {model}, collections.deque([(model, "")])
    while queue:
        node, path = queue.popleft()
        for child in graph.nodes[node].children:
            if child.node_id in seen:
                continue
            seen.add(child.node_id)
            child_path = f"{path}/{child.local_name}" if path else child.local_name
            queue.append((child.node_id, child_path))
            for attribute in graph.nodes[child.node_id].attributes:
                if attribute.name == "VARIABLE_VALUE":
                    values[child_path] = reader.get_tensor(attribute.checkpoint_key)
    return values


def _weights_file_places(model) -> dict[int, str]:
    """{id(variable): its dataset path in a .weights.h5 of `model`}, from Keras' own saving walk."""
    from keras.src.saving import saving_lib  # The pinned Keras' layout of weights files (requirements-common.txt).

    class Recorder(saving_lib.H5IOStore):
        def __init__(self):  # Records where each variable would be written; opens no file.
            self.places = {}

        def __bool__(self):  # _save_state asks the store whether it is open.
            return True

        def make(self, path, metadata=None):
            recorder = self

            class Place(dict):
                def __setitem__(self, key, variable):
                    recorder.places[id(variable)] = f"{path}/vars/{key}" if path else f"vars/{key}"

            return Place()

    recorder = Recorder()
    saving_lib._save_state(model, weights_store=recorder, assets_store=None, inner_path="", visited_saveables=set())
    return recorder.places


def _weights_file_values(path: str) -> dict[str, np.ndarray]:
    """{dataset path: value} of every array in the weights file (a gs:// one is copied to a local file first)."""
    import h5py

    with tempfile.TemporaryDirectory() as folder:
        local = path
        if "://" in path:
            local = os.path.join(folder, "source" + WEIGHTS_SUFFIX)
            tf.io.gfile.copy(path, local)
        values = {}
        try:
            with h5py.File(local, "r") as file:
                file.visititems(lambda name, item: values.__setitem__(name, item[()])
                                if isinstance(item, h5py.Dataset) else None)
        except OSError as error:
            raise ConfigError(f"INIT_FROM={path!r} is not a readable HDF5 weights file ({error}); write one with "
                              "model.save_weights('name.weights.h5').") from error
    return values


def warm_start(model, init_from: str, *, include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> dict:
    """Loads `model`'s variables from INIT_FROM (module docstring); logs the table; returns {path: status}."""
    kind, source = resolve(init_from)
    variables = list(model.variables)
    paths = [variable.path for variable in variables]
    chosen = select(paths, include=include, exclude=exclude, include_setting="experiment.init_include",
                    exclude_setting="experiment.init_exclude")
    if kind == "checkpoint":
        places, values = _trackable_paths(model), _checkpoint_values(source)
    else:
        places, values = _weights_file_places(model), _weights_file_values(source)
    status, mismatched, assignments = {}, [], []
    for variable, path, wanted in zip(variables, paths, chosen, strict=True):
        value = values.get(places.get(id(variable)))
        if not wanted:
            status[path] = "skipped (experiment.init_include/init_exclude)"
        elif value is None:
            status[path] = "skipped (not in the source)"
        elif tuple(value.shape) != tuple(variable.shape):
            status[path] = f"shape mismatch: source {tuple(value.shape)}, model {tuple(variable.shape)}"
            mismatched.append(f"{path} (source {tuple(value.shape)}, model {tuple(variable.shape)})")
        else:
            status[path] = "restored"
            assignments.append((variable, value))
    log.info("Warm start from %s (%s; optimizer state not taken):\n%s", source, kind, table(status))
    if mismatched:
        raise ConfigError(f"INIT_FROM={init_from!r}: {len(mismatched)} variable(s) do not fit the model: "
                          f"{', '.join(mismatched)}. Exclude them to keep their fresh initial values, e.g. "
                          f"--gin_param=\"experiment.init_exclude=['{mismatched[0].split('/')[0]}']\".")
    if not assignments:
        raise ConfigError(f"INIT_FROM={init_from!r}: no variable of the model was restored from {source} (none "
                          f"selected or none found: {', '.join(f'{path}: {state}' for path, state in status.items())}"
                          "). Is it a checkpoint of this MODEL? Fix INIT_FROM or experiment.init_include.")
    for variable, value in assignments:
        variable.assign(value.astype(variable.dtype))
    return status


def table(status: dict) -> str:
    """The per-variable table of a warm start, then the counts."""
    width = max(len(path) for path in status)
    lines = [f"  {'variable':<{width}}  status"] + [f"  {path:<{width}}  {state}" for path, state in status.items()]
    counts = collections.Counter(state.split(" (")[0].split(":")[0] for state in status.values())
    return "\n".join(lines + ["  " + ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))])


def check_settings(config) -> dict:
    """INIT_FROM and the variable patterns: strings, patterns only with a source to load (before any build)."""
    patterns = {name: check_patterns(f"experiment.{name}", getattr(config, name))
                for name in ("init_include", "init_exclude", "trainable", "frozen")}
    init_from = config.init_from
    if init_from is not None and (not isinstance(init_from, str) or not init_from.strip()):
        raise ConfigError(f"INIT_FROM={init_from!r} must be a path (a run's model_dir, a checkpoint prefix or a "
                          ".weights.h5 file, local or gs://) or None; e.g. "
                          f"{how_to_set('init_from', 'runs/pretrain')}.")
    if isinstance(init_from, str) and init_from.endswith(".keras"):
        raise ConfigError(f"INIT_FROM={init_from!r}: a .keras model file is not read; save its weights "
                          "(keras.saving.load_model(path).save_weights('model.weights.h5')) and give that file.")
    if init_from is None and (patterns["init_include"] or patterns["init_exclude"]):
        raise ConfigError("experiment.init_include/init_exclude are set but INIT_FROM is None: set INIT_FROM, e.g. "
                          f"{how_to_set('init_from', 'runs/pretrain')}, or drop them.")
    return patterns
