"""One set of examples (a single CSV, .npz or image folder) split into 'train' and 'test' by `--test_fraction` and
`--seed`: the usual form of a data set is one file, and a split by hand is where leaks and lopsided classes come from.

The split is seeded (the same fraction and seed give the same split on every rerun and machine: NumPy's PCG64) and,
for class labels, stratified: each class puts round(count x fraction) of its examples into test, but always keeps at
least one in train (a model cannot learn a class it never sees), so each class keeps its proportion to within one
example. Regression targets are split as one group. Both splits keep the source's order of examples.
"""

import numpy as np

from common.errors import ConfigError


def is_class_label(labels: np.ndarray, label_kind: str) -> bool:
    """Whether `labels` are classes, as stage/columns.py will stage them: text and integers unless
    --label_kind=number, floats only with --label_kind=class."""
    if label_kind != "auto":
        return label_kind == "class"
    return labels.dtype.kind != "f"


def split_examples(inputs: np.ndarray, labels: np.ndarray, fraction: float, seed: int, by_class: bool) -> dict:
    """{'train': (inputs, labels), 'test': (inputs, labels)}: `fraction` of the examples in test (per class when
    `by_class`), chosen by a generator seeded with `seed`; a ConfigError when that leaves a split empty."""
    if len(inputs) != len(labels):
        raise ConfigError(f"{len(inputs)} inputs but {len(labels)} labels; give one label per example.")
    rng = np.random.default_rng(seed)
    groups = ([np.flatnonzero(labels == value) for value in np.unique(labels)] if by_class
              else [np.arange(len(labels))])
    test = []
    for members in groups:
        count = min(int(np.floor(len(members) * fraction + 0.5)), len(members) - 1)
        if not by_class:
            count = max(count, 1)
        test.append(rng.permutation(members)[:count])
    test = np.sort(np.concatenate(test)) if test else np.array([], np.int64)
    train = np.setdiff1d(np.arange(len(labels)), test)
    if not len(test) or not len(train):
        raise ConfigError(f"--test_fraction={fraction} of {len(labels)} examples"
                          f"{' (per class, keeping one of each in train)' if by_class else ''} leaves "
                          f"{'no test' if not len(test) else 'no train'} examples: raise --test_fraction, or bring "
                          "more examples.")
    return {"train": (inputs[train], labels[train]), "test": (inputs[test], labels[test])}


def describe(fraction: float, seed: int, by_class: bool, splits: dict) -> str:
    """The split for the dataset's metadata (its description): how it was made and the sizes it gave."""
    sizes = ", ".join(f"{len(labels)} {split}" for split, (_, labels) in splits.items())
    return (f"Split from one source by python -m stage: --test_fraction={fraction} --seed={seed}"
            f"{', stratified by class' if by_class else ''} ({sizes} examples).")
