"""`experiment.augmentation`: training augmentations by name, checked and resolved before anything is built.

    experiment.augmentation = ['flip_and_crop', 'randaugment', 'mixup']

Per-example ones ('flip_and_crop': CIFAR-10's flip and crop at any size, flip_and_crop.py; 'randaugment':
randaugment.py) run where the task prepares a training example, in the order listed, each with its own stream of the
example's seed (SEED, position). Batch ones ('mixup', 'cutmix': mixing.py) run in the training step on the device,
pairing rows 2k and 2k + 1; naming both switches between them per batch (CutMix with probability
mixup_or_cutmix.cutmix_probability, 0.5), as timm and DeiT do. None (the default) keeps the dataset's own
augmentation (CIFAR-10: flip-and-crop, data/registry.py); [] turns it off. Which names a task takes is the task's
own `augmentations` (tasks/base.py; image classification takes all four), asked by `check` before the dataset is
prepared. Evaluation never augments and scores the hard labels.
"""

import dataclasses

import tensorflow as tf

from common.errors import ConfigError
from common.registry import lookup
from tasks.augmentation.flip_and_crop import flip_and_crop
from tasks.augmentation.mixing import cutmix, mixup, mixup_or_cutmix
from tasks.augmentation.randaugment import randaugment
from tasks.image_classification import ImageClassification

PER_EXAMPLE = ("flip_and_crop", "randaugment")
PER_BATCH = {"mixup": mixup, "cutmix": cutmix}
# By name, for the lookup (common/registry.py): what each is.
AUGMENTATIONS = {**{name: "per example" for name in PER_EXAMPLE}, **{name: "per batch" for name in PER_BATCH}}


def on_unit_pixels(augment, task: ImageClassification):
    """`augment` of [0, 1] pixels wrapped for the task's standardised images (undone, augmented, redone)."""
    mean = tf.constant(task.mean, tf.float32)
    std = tf.constant(task.std, tf.float32)
    inverse_std = tf.constant([1.0 / value for value in task.std], tf.float32)

    def wrapped(image, seed):
        return (augment(image * std + mean, seed) - mean) * inverse_std

    return wrapped


def chain(augments: list):
    """One (image, seed) augmentation running `augments` in order, each on its own split of the seed; one alone
    keeps the seed as is (so ['flip_and_crop'] on CIFAR-10 draws what its default does)."""
    if len(augments) == 1:
        return augments[0]

    def chained(image, seed):
        for augment, own_seed in zip(augments, tf.unstack(tf.random.experimental.stateless_split(
                seed, num=len(augments))), strict=True):
            image = augment(image, own_seed)
        return image

    return chained


def check(names, task, *, dataset: str) -> tuple[str, ...] | None:
    """`names` as a tuple (None: the dataset's own); ConfigErrors for a value that is not a list of names, an unknown
    or repeated name, or one the task does not take (`task.augmentations`). Needs only the registered task, so the
    Trainer asks it before the dataset is prepared."""
    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"experiment.augmentation={names!r} must be a list of names, e.g. "
                          "--gin_param=\"experiment.augmentation=['randaugment', 'mixup']\".")
    for name in names:
        lookup(AUGMENTATIONS, name, named=f"experiment.augmentation entry {name!r}", known="augmentations",
               where="tasks/augmentation/by_name.py")
    if len(set(names)) != len(names):
        raise ConfigError(f"experiment.augmentation={list(names)} names one augmentation twice; list each once.")
    refused = [name for name in names if name not in task.augmentations]
    if refused:
        takes = f"takes {', '.join(task.augmentations)}" if task.augmentations else "takes none"
        raise ConfigError(f"experiment.augmentation={list(names)}: DATASET={dataset!r} is a {type(task).__name__} "
                          f"task, which {takes} (tasks/, its `augmentations`). Remove {', '.join(map(repr, refused))}"
                          " (or set experiment.augmentation=[]).")
    return tuple(names)


def resolve(names, task, *, dataset: str, rows_per_batch: int) -> tuple[object, object]:
    """(the task with its per-example augmentation set, the step's mixing or None) for `names`: `check`'s
    ConfigErrors, and one for an odd per-replica (micro-)batch `rows_per_batch` when a batch augmentation pairs rows."""
    names = check(names, task, dataset=dataset)
    if names is None:
        return task, None
    batch_names = [name for name in names if name in PER_BATCH]
    if batch_names and rows_per_batch % 2:
        raise ConfigError(f"experiment.augmentation={' and '.join(map(repr, batch_names))} mixes rows 2k and 2k + 1 "
                          f"of each per-replica batch, which has an odd {rows_per_batch} rows (GLOBAL_BATCH_SIZE / "
                          "replicas / ACCUMULATE_STEPS). Use a GLOBAL_BATCH_SIZE that gives an even number per "
                          "replica.")
    makers = {"flip_and_crop": lambda: flip_and_crop,
              "randaugment": lambda: on_unit_pixels(randaugment(), task)}
    augments = [makers[name]() for name in names if name in PER_EXAMPLE]
    task = dataclasses.replace(task, augment=chain(augments) if augments else None)
    if len(batch_names) == 2:  # Both: one of them per batch (tasks/augmentation/mixing.py MixupOrCutmix).
        return task, mixup_or_cutmix()
    return task, PER_BATCH[batch_names[0]]() if batch_names else None


def check_settings(config) -> dict:
    """experiment.augmentation as a tuple (a gin list); the names are checked against the task (`check`)."""
    return {"augmentation": tuple(config.augmentation) if isinstance(config.augmentation, list)
            else config.augmentation}
