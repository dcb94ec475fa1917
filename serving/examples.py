"""Real examples for the export's warmup and example requests: the first few of the evaluation split, as a client
sends them (Task.serving_example: raw features, the signature's dtypes)."""

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds


def first_examples(task, builder: tfds.core.DatasetBuilder, split: str, count: int) -> dict | None:
    """{input name: array [n, ...]} of the first `count` examples of `split` (n <= count), in file order; None when
    the task defines no serving_example or the split is empty."""
    features = builder.info.features
    # No auto-cache: reading a few examples of a small split would cache it and warn that the cache is discarded.
    dataset = builder.as_dataset(split=split, shuffle_files=False, decoders=task.decoders(features) or None,
                                 read_config=tfds.ReadConfig(try_autocache=False))
    rows = []
    for example in dataset.take(count):
        try:
            rows.append(task.serving_example(example, features))
        except NotImplementedError:
            return None
    if not rows:
        return None
    return {name: np.stack([tf.convert_to_tensor(row[name]).numpy() for row in rows]) for name in rows[0]}
