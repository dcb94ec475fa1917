"""What in a built model breaks replica invariance, found by looking at its layers (training/replica_invariance.py).

The check runs the model as its builder makes it when asked for synchronized BatchNormalization
(`synchronized_batch_norm=True`); a builder may ignore that, or use layers whose random draws depend on the replica
count. Found here, by layer path (`block/bn`, the names from the model down):
- a BatchNormalization that is not synchronized: each replica normalises with its own part of the batch;
- a random layer that draws from a Keras seed state (keras.layers.Dropout, SpatialDropout*, GaussianDropout,
  GaussianNoise, AlphaDropout, the Random* preprocessing layers): every replica holds a copy of the state, so the
  draws depend on how the batch was split, where models.layers.StatelessDropout keys each example's mask by its
  position (common/keyed_random.py).
Not found (the FAIL report's generic causes cover them): a custom layer with its own per-replica state or its own
random numbers, and any bug in the loss or the step.
"""

import dataclasses

import keras

from models.layers import StatelessDropout

_DROPOUT_FIX = "use models.layers.StatelessDropout(rate, salt=N) (its masks are keyed by example, models/layers.py)"
_AUGMENT_FIX = ("augment in the input pipeline instead, keyed by example (experiment.augmentation, "
                "tasks/augmentation/by_name.py)")
_BATCH_NORM_FIX = ("build it with keras.layers.BatchNormalization(synchronized=synchronized_batch_norm), the "
                   "builder's argument (the check passes True; models/registry.py)")


@dataclasses.dataclass
class ModelFacts:
    """What the check says of the model it ran: BatchNormalization (path, synchronized), keyed dropout paths, and
    the layers that break replica invariance, each 'path: what, and the fix'."""

    batch_norm: list = dataclasses.field(default_factory=list)
    keyed_dropout: list = dataclasses.field(default_factory=list)
    findings: list = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        """e.g. '3 BatchNormalization layers, all synchronized; dropout keyed by example (1 layer)'."""
        unsynchronized = sum(not synchronized for _, synchronized in self.batch_norm)
        if not self.batch_norm:
            parts = ["no BatchNormalization"]
        else:
            state = f"{unsynchronized} NOT synchronized" if unsynchronized else "all synchronized"
            parts = [f"{_layers(len(self.batch_norm), 'BatchNormalization')}, {state}"]
        if self.keyed_dropout:
            parts.append(f"dropout keyed by example ({_layers(len(self.keyed_dropout))})")
        random = len(self.findings) - unsynchronized
        if random:
            parts.append(f"{_layers(random, 'random')} NOT keyed by example")
        if len(parts) == 1:
            parts.append("no dropout")
        return "; ".join(parts)


def _layers(count: int, kind: str = "") -> str:
    return f"{count} {kind + ' ' if kind else ''}layer{'s' if count != 1 else ''}"


def layers_by_path(model: keras.Layer, prefix: str = ""):
    """(path, layer) for every layer inside `model`, depth first; a layer shared by several parents comes once."""
    seen = set()

    def walk(parent, parent_path):
        for layer in parent._flatten_layers(include_self=False, recursive=False):
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            path = f"{parent_path}/{layer.name}" if parent_path else layer.name
            yield path, layer
            yield from walk(layer, path)

    yield from walk(model, prefix)


def inspect(model: keras.Layer) -> ModelFacts:
    """The model's BatchNormalization and random layers, and what in them breaks replica invariance."""
    facts = ModelFacts()
    for path, layer in layers_by_path(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            facts.batch_norm.append((path, bool(layer.synchronized)))
            if not layer.synchronized:
                facts.findings.append(f"{path}: BatchNormalization not synchronized: each replica normalises with its "
                                      f"own part of the batch. Fix: {_BATCH_NORM_FIX}.")
        elif isinstance(layer, StatelessDropout):
            if layer.rate:
                facts.keyed_dropout.append(path)
        elif _seeded(layer) and _draws(layer):
            kind = type(layer).__name__
            fix = _AUGMENT_FIX if kind.startswith("Random") else _DROPOUT_FIX
            facts.findings.append(f"{path}: keras.layers.{kind} draws from a seed state that every replica holds a "
                                  f"copy of, not from the example, so its draws depend on the replica count. Fix: "
                                  f"{fix}.")
    return facts


def _seeded(layer) -> bool:
    """Whether the layer holds a Keras seed state (Dropout's seed_generator, the Random* layers' generator)."""
    return any(isinstance(value, keras.random.SeedGenerator) for value in vars(layer).values())


def _draws(layer) -> bool:
    """Whether a seeded layer draws anything in training (a Dropout of rate 0 or a noise of stddev 0 does not)."""
    return all(getattr(layer, name, 1) != 0 for name in ("rate", "stddev"))
