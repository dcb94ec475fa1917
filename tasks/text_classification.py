"""Text classification: a string feature -> token ids of a fixed length (in the graph) -> a class.

Tokenisation: lower case, every character but letters, digits and apostrophes becomes a space, split on spaces;
each word maps to its id in the vocabulary (2, 3, ...), an unknown word to 1 (OOV), and the ids are truncated or
padded with 0 to `sequence_length` (static shapes for TPUs; 0 marks padding, which the model masks). The same
function runs in the input pipeline and in the exported model, which serves raw strings.

The vocabulary is the train split's `max_tokens - 2` most frequent words (ties broken alphabetically), counted when
the task is bound to the prepared dataset: the same on every host and on resume; or set `vocabulary` by hand. Its size
and its coverage of the train split's tokens (the share that is not OOV) are logged once, when counted.

The lookup matches a word's 64-bit fingerprint (`tf.strings.to_hash_bucket_fast`, a FarmHash that TensorFlow
documents never changes) against the vocabulary's sorted fingerprints with `tf.searchsorted`. It needs no lookup
table: a `tf.lookup.StaticHashTable` or `StringLookup` is a resource, which the SavedModel would have to track and
which lives on the device that created it, while this is constants only, the same in tf.data and in serving. Two
vocabulary words with one fingerprint are refused when binding (a chance of ~1e-13 for 1,000 words).
"""

import collections
import dataclasses
import functools
import logging

import numpy as np
import tensorflow as tf

from tasks.base import ClassificationTask, classification_outputs, label_names

PADDING_ID, OOV_ID = 0, 1
_FINGERPRINT_BUCKETS = 2 ** 63 - 1

log = logging.getLogger(__name__)


def _log_vocabulary(size: int, distinct: int, covered: int, total: int, split: str, max_tokens: int) -> None:
    """Once, when the vocabulary is counted: its size and the share of split's tokens it covers (the rest map to
    OOV), so a vocabulary too small for the data (low coverage: raise max_tokens) shows before training."""
    coverage = covered / total if total else 0.0
    log.info("Text vocabulary: %d words (of %d distinct in split %r; max_tokens=%d keeps up to %d), covering %.1f%% "
             "of its %d tokens (the rest are out of vocabulary).", size, distinct, split, max_tokens, max_tokens - 2,
             100 * coverage, total)


def standardize(texts: tf.Tensor) -> tf.Tensor:
    """Strings (any shape) -> lower case, punctuation replaced by spaces."""
    return tf.strings.regex_replace(tf.strings.lower(texts), r"[^a-z0-9']+", " ")


def fingerprints(words) -> tf.Tensor:
    """int64 fingerprints of strings (any shape): equal strings, equal fingerprints, in every process."""
    return tf.strings.to_hash_bucket_fast(words, _FINGERPRINT_BUCKETS)


@dataclasses.dataclass(frozen=True)
class TextClassification(ClassificationTask):
    num_classes: int = 2
    sequence_length: int = 32  # Token ids per example, after truncation or padding.
    max_tokens: int = 1000  # Vocabulary size the model embeds: padding, OOV and up to max_tokens - 2 words.
    text_key: str = "text"
    train_split: str = "train"  # Where the vocabulary is counted.
    vocabulary: tuple[str, ...] | None = None  # None until bind(); or set it (ids 2, 3, ... in this order).
    class_names: tuple[str, ...] | None = None  # From the dataset's ClassLabel (bind).

    def __post_init__(self):
        for name in ("num_classes", "sequence_length", "max_tokens"):
            if getattr(self, name) < (3 if name == "max_tokens" else 1):
                raise ValueError(f"TextClassification {name}={getattr(self, name)!r} is too small; e.g. "
                                 "num_classes=2, sequence_length=32, max_tokens=1000.")

    @property
    def keys(self) -> tuple[str, ...]:
        return self.text_key, self.label_key

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.sequence_length,)

    @property
    def output_size(self) -> int:
        return self.num_classes

    @property
    def vocabulary_size(self) -> int:
        """Ids the model embeds: padding, OOV and the words."""
        return 2 + len(self._bound_vocabulary())

    def model_options(self) -> dict:
        return {"vocab_size": self.vocabulary_size}

    def bind(self, builder):
        task = dataclasses.replace(self, class_names=label_names(builder, self.label_key))
        if task.vocabulary is None:
            texts = (builder.as_dataset(split=self.train_split, shuffle_files=False)
                     .map(lambda example: standardize(example[self.text_key])).batch(4096))
            counts = collections.Counter(word.decode() for batch in texts.as_numpy_iterator() for text in batch
                                         for word in text.split())
            ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:self.max_tokens - 2]
            task = dataclasses.replace(task, vocabulary=tuple(word for word, _ in ranked))
            _log_vocabulary(len(ranked), len(counts), sum(count for _, count in ranked), counts.total(),
                            self.train_split, self.max_tokens)
        task._lookup  # noqa: B018 - Refuses a collision now, before anything is built.
        return task

    def _bound_vocabulary(self) -> tuple[str, ...]:
        if self.vocabulary is None:
            raise ValueError("TextClassification has no vocabulary: call bind(builder) first, or set vocabulary.")
        if len(self.vocabulary) > self.max_tokens - 2:
            raise ValueError(f"TextClassification vocabulary has {len(self.vocabulary)} words, more than "
                             f"max_tokens - 2 = {self.max_tokens - 2}; raise max_tokens or shorten the vocabulary.")
        return self.vocabulary

    @functools.cached_property
    def _lookup(self) -> tuple[np.ndarray, np.ndarray]:
        """(the vocabulary's fingerprints, sorted; the id of each). Computed eagerly once, even when first asked
        for while a tf.data or serving function is traced."""
        vocabulary = self._bound_vocabulary()
        if not vocabulary:
            return np.zeros([0], np.int64), np.zeros([0], np.int32)
        with tf.init_scope():
            values = fingerprints(tf.constant(vocabulary)).numpy()
        order = np.argsort(values, kind="stable")
        if len(np.unique(values)) != len(values):
            raise ValueError("Two vocabulary words share a 64-bit fingerprint; drop one of them from the vocabulary.")
        return values[order], (order + 2).astype(np.int32)

    def tokenize(self, texts: tf.Tensor) -> tf.Tensor:
        """Strings [batch] -> int32 token ids [batch, sequence_length] (see the module docstring)."""
        sorted_values, ids = self._lookup
        words = tf.strings.split(standardize(texts))  # Ragged [batch, words].
        if not len(sorted_values):
            token_ids = tf.ragged.map_flat_values(lambda flat: tf.fill(tf.shape(flat), OOV_ID), words)
        else:
            def lookup(flat_words):
                values = fingerprints(flat_words)
                index = tf.minimum(tf.searchsorted(tf.constant(sorted_values), values), len(sorted_values) - 1)
                found = tf.equal(tf.gather(tf.constant(sorted_values), index), values)
                return tf.where(found, tf.gather(tf.constant(ids), index), OOV_ID)

            token_ids = tf.ragged.map_flat_values(lookup, words)
        return token_ids.to_tensor(default_value=PADDING_ID, shape=[texts.shape[0], self.sequence_length])

    def prepare(self, example, features, *, seed=None):
        token_ids = self.tokenize(tf.reshape(example[self.text_key], [1]))[0]
        return tf.ensure_shape(token_ids, (self.sequence_length,)), example[self.label_key]

    def prepare_batch(self, examples, features, *, seeds):
        """The whole batch tokenised at once (the same ids as `prepare` per example; no randomness)."""
        return self.tokenize(examples[self.text_key]), examples[self.label_key]

    def serving_signature(self):
        return {"text": tf.TensorSpec([None], tf.string, name="text")}

    def serve(self, model, inputs):
        return classification_outputs(model(self.tokenize(inputs["text"]), training=False), self.class_names)

    def serving_example(self, example, features):
        return {"text": example[self.text_key]}

    def serving_metadata(self):
        return {**super().serving_metadata(), "class_names": list(self.class_names) if self.class_names else None}
