"""`experiment.augmentation`: training augmentations by name, checked and resolved before anything is built.

    experiment.augmentation = ['flip_and_crop', 'randaugment', 'mixup']

Per-example ones run where the task prepares a training example, in the order listed ('flip_and_crop': CIFAR-10's
flip and crop at any size, tasks/image_classification.py; 'randaugment': tasks/randaugment.py); each gets its own
stream of the example's seed (SEED, position). At most one batch one ('mixup' or 'cutmix':
training/learning/mixing.py) runs in the training step on the device, pairing rows 2k and 2k + 1. None (the default)
keeps the dataset's own augmentation (CIFAR-10: flip-and-crop, data/registry.py); [] turns it off. Image
classification tasks only. Evaluation never augments and scores the hard labels.
"""

import dataclasses

import tensorflow as tf

from common.errors import ConfigError
from tasks.image_classification import ImageClassification, flip_and_crop
from tasks.randaugment import randaugment
from training.learning.mixing import Mixing, cutmix, mixup

PER_EXAMPLE = ("flip_and_crop", "randaugment")
PER_BATCH = {"mixup": mixup, "cutmix": cutmix}
NAMES = (*PER_EXAMPLE, *PER_BATCH)


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


def resolve(names, task, *, dataset: str, rows_per_batch: int) -> tuple[object, Mixing | None]:
    """(the task with its per-example augmentation set, the step's Mixing or None) for `names`; ConfigErrors for an
    unknown name, a non-image task, two batch mixings, or an odd per-replica (micro-)batch `rows_per_batch`."""
    if names is None:
        return task, None
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"experiment.augmentation={names!r} must be a list of names, e.g. "
                          "--gin_param=\"experiment.augmentation=['randaugment', 'mixup']\".")
    unknown = [name for name in names if name not in NAMES]
    if unknown:
        raise ConfigError(f"experiment.augmentation names {unknown}, which is not known; known: "
                          f"{', '.join(NAMES)} (training/augmentation.py).")
    if len(set(names)) != len(names):
        raise ConfigError(f"experiment.augmentation={list(names)} names one augmentation twice; list each once.")
    if names and not isinstance(task, ImageClassification):
        raise ConfigError(f"experiment.augmentation={list(names)} is for image classification; DATASET="
                          f"{dataset!r} is a {type(task).__name__} task. Remove the setting (or set it to []).")
    batch_names = [name for name in names if name in PER_BATCH]
    if len(batch_names) > 1:
        raise ConfigError(f"experiment.augmentation={list(names)} names {' and '.join(batch_names)}; choose one "
                          "(each pairs the same rows).")
    if batch_names and rows_per_batch % 2:
        raise ConfigError(f"experiment.augmentation={batch_names[0]!r} mixes rows 2k and 2k + 1 of each "
                          f"per-replica batch, which has an odd {rows_per_batch} rows (GLOBAL_BATCH_SIZE / replicas"
                          " / ACCUMULATE_STEPS). Use a GLOBAL_BATCH_SIZE that gives an even number per replica.")
    makers = {"flip_and_crop": lambda: flip_and_crop,
              "randaugment": lambda: on_unit_pixels(randaugment(), task)}
    augments = [makers[name]() for name in names if name in PER_EXAMPLE]
    task = dataclasses.replace(task, augment=chain(augments) if augments else None)
    return task, PER_BATCH[batch_names[0]]() if batch_names else None
