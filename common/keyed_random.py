"""Random numbers that are a hash of a key: integer ops only, so the same with and without XLA on every device.

tf.random's stateless ops are a function of their seed on one device and compiler, but pick another generator under
XLA (and on TPUs). Draws that must be the same everywhere (dropout masks, models/layers.py; augmentation, tasks/ and
tasks/augmentation/mixing.py; the epoch permutation, below) hash a key with `lowbias32` (a 32-bit
integer finaliser with low bias, C. Wellons, "Prospecting for Hash Functions") instead.

The epoch permutation of the training stream (`epoch_permutation`, below; data/pipeline.py) is built from the
same hash: position p of the stream is example epoch_permutation(p mod n, seed=SEED, epoch=p div n) of the train
split, computed by the host's tf.data pipeline and inside a TPU's compiled loop (data/device_split.py), so it must
give the same integers on a CPU, under XLA and on a TPU. tf.random.experimental.index_shuffle has no XLA kernel;
`epoch_permutation` is
- a balanced Feistel network over the 2h-bit integers, h = ceil(bits(n - 1) / 2) (at least 1), so the domain
  [0, 4**h) holds [0, n) and is less than 4 n: each round swaps the halves and XORs one with a hash of the other and
  the round's key; any round function gives a bijection of the domain, six rounds of a good one a well-mixed one
  (16 on domains of at most 16 integers, where six leave places measurably uneven: tests/test_permutation.py);
- cycle-walking: an index the network sends outside [0, n) is sent through it again until it lands inside, which
  restricts the domain's bijection to one of [0, n) (a cycle through an index inside returns inside); on average
  fewer than 4 passes, every index walked in the same vectorised tf.while_loop;
- round keys that hash (SEED, epoch) and the round.
Unsigned 32-bit arithmetic only (multiply, shift, XOR, AND, compare), which wraps the same on every backend; splits
up to 2**31 examples (the in-memory ones are far smaller: data/pipeline.py's 1 GiB limit).
"""

import functools

import numpy as np
import tensorflow as tf

_UNIFORM_SCALE = 2.0 ** -24  # 24 random bits -> a float that float32 represents exactly.


def lowbias32(values: tf.Tensor) -> tf.Tensor:
    """Hashes uint32 values elementwise (a bijection on 32-bit integers with well-mixed output bits)."""
    values = tf.bitwise.bitwise_xor(values, tf.bitwise.right_shift(values, tf.constant(16, tf.uint32)))
    values = values * tf.constant(0x7FEB352D, tf.uint32)
    values = tf.bitwise.bitwise_xor(values, tf.bitwise.right_shift(values, tf.constant(15, tf.uint32)))
    values = values * tf.constant(0x846CA68B, tf.uint32)
    return tf.bitwise.bitwise_xor(values, tf.bitwise.right_shift(values, tf.constant(16, tf.uint32)))


def seed_keys(seeds: tf.Tensor) -> tf.Tensor:
    """uint32 keys [...] from stateless seeds [..., 2] (int64: SEED, position or epoch), hashing all four 32-bit
    words."""
    seeds = tf.cast(seeds, tf.int64)
    key = tf.zeros(tf.shape(seeds)[:-1], tf.uint32)
    for column in range(2):
        word = seeds[..., column]
        for half in (tf.bitwise.right_shift(word, tf.constant(32, tf.int64)),
                     tf.bitwise.bitwise_and(word, tf.constant(0xFFFFFFFF, tf.int64))):
            key = lowbias32(tf.bitwise.bitwise_xor(key, lowbias32(tf.cast(half, tf.uint32))))
    return key


def hashed_uniforms(keys: tf.Tensor, count: int) -> tf.Tensor:
    """[n, count] floats in (0, 1) from uint32 keys [n], a hash of (key, counter): 24 random bits each, never 0."""
    spread = (np.arange(count, dtype=np.uint64) * 0x9E3779B9 + 1) % (1 << 32)  # Distinct counters over 32 bits.
    counters = lowbias32(tf.constant(spread.astype(np.uint32)))
    bits = lowbias32(tf.bitwise.bitwise_xor(tf.cast(keys, tf.uint32)[:, tf.newaxis], counters[tf.newaxis]))
    return (tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), tf.float32) + 0.5) * _UNIFORM_SCALE


def _xor(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    return tf.bitwise.bitwise_xor(a, b)


def keys_from_positions(seed: int, positions: tf.Tensor) -> tf.Tensor:
    """Per-example uint32 keys from the run's SEED and each example's int64 training-stream position."""
    positions = tf.cast(positions, tf.int64)
    high = tf.cast(tf.bitwise.right_shift(positions, tf.constant(32, tf.int64)), tf.uint32)
    low = tf.cast(tf.bitwise.bitwise_and(positions, tf.constant(0xFFFFFFFF, tf.int64)), tf.uint32)
    seed_key = lowbias32(_xor(tf.constant(seed & 0xFFFFFFFF, tf.uint32), lowbias32(tf.constant(seed >> 32, tf.uint32))))
    return lowbias32(_xor(lowbias32(_xor(seed_key, high)), low))


ROUNDS = 6  # Feistel rounds of epoch_permutation.
SMALL_DOMAIN_ROUNDS = 16  # For h <= 2: splits of at most 16 examples.
MAX_SIZE = 2 ** 31


def half_bits(size: int) -> int:
    """h: the Feistel halves' width for a split of `size` examples (the domain [0, 4**h) holds [0, size))."""
    return max(1, ((size - 1).bit_length() + 1) // 2)


def rounds_for(size: int) -> int:
    """How many Feistel rounds the permutation of [0, size) takes."""
    return SMALL_DOMAIN_ROUNDS if half_bits(size) <= 2 else ROUNDS


def _round_keys(seed: tf.Tensor, epoch: tf.Tensor, rounds: int) -> list[tf.Tensor]:
    """One uint32 key per round (each shaped like seed and epoch broadcast), from a hash of (seed, epoch)."""
    seed, epoch = seed + tf.zeros_like(epoch), epoch + tf.zeros_like(seed)
    key = seed_keys(tf.stack([seed, epoch], axis=-1))
    return [lowbias32(tf.bitwise.bitwise_xor(key, tf.constant((0x9E3779B9 * (index + 1)) & 0xFFFFFFFF, tf.uint32)))
            for index in range(rounds)]


def _feistel(values: tf.Tensor, keys: list[tf.Tensor], bits: int) -> tf.Tensor:
    """The keyed bijection of [0, 4**bits) on uint32 `values`."""
    shift, half_mask = tf.constant(bits, tf.uint32), tf.constant((1 << bits) - 1, tf.uint32)
    left, right = tf.bitwise.right_shift(values, shift), tf.bitwise.bitwise_and(values, half_mask)
    for key in keys:
        mixed = tf.bitwise.bitwise_and(lowbias32(tf.bitwise.bitwise_xor(right, key)), half_mask)
        left, right = right, tf.bitwise.bitwise_xor(left, mixed)
    return tf.bitwise.bitwise_or(tf.bitwise.left_shift(left, shift), right)


def epoch_permutation(indices: tf.Tensor, *, seed, epoch, size: int, rounds: int | None = None) -> tf.Tensor:
    """The images (int64) of int64 `indices` (each in [0, size)) under epoch `epoch`'s permutation of [0, size),
    keyed by `seed`. `seed` and `epoch`: int64 tensors or Python ints, scalars or shaped like `indices` (one
    permutation per element). `rounds` (default rounds_for(size)) is for the tests' weak control.

    Runs compiled by XLA wherever it is called (host tf.data pipeline, CPU/GPU/TPU loop): as a few hundred separate
    integer ops per batch it cost the host pipeline 3/4 of its speed and the MLP's training 3.4x (docs/throughput.md);
    fused, nothing measurable. Integer ops give the same result either way."""
    if not 1 <= size <= MAX_SIZE:
        raise ValueError(f"size={size}: the epoch permutation covers splits of 1 to {MAX_SIZE} examples")
    arguments = (tf.convert_to_tensor(indices, tf.int64), tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64))
    if not tf.inside_function():  # Called eagerly (tf.functions run eagerly too): nothing is traced per device.
        return _compiled_permutation(size, rounds or rounds_for(size))(*arguments)
    shapes = tuple(None if value.shape.rank is None else tuple(value.shape.as_list()) for value in arguments)
    return _traced_permutation(size, rounds or rounds_for(size), shapes)(*arguments)


@functools.cache
def _traced_permutation(size: int, rounds: int, shapes: tuple):
    """The compiled permutation traced once per split size and argument shapes, outside any device scope, for calls
    in a traced step. Called as a tf.function in each replica's device scope (MirroredStrategy traces the step once
    per device), it was traced and XLA-compiled once per device: a quarter of an 8-replica step's trace time. The
    call still runs on the caller's device."""
    with tf.device(None):
        return _compiled_permutation(size, rounds).get_concrete_function(
            *(tf.TensorSpec(shape, tf.int64) for shape in shapes))


@functools.cache
def _compiled_permutation(size: int, rounds: int):
    """epoch_permutation's body for one split size, as an XLA-compiled tf.function of (indices, seed, epoch)."""
    bits = half_bits(size)

    @tf.function(jit_compile=True)
    def permute(indices, seed, epoch):
        keys, limit = _round_keys(seed, epoch, rounds), tf.constant(size, tf.uint32)

        def walk(values):
            return (tf.where(values >= limit, _feistel(values, keys, bits), values),)

        first = _feistel(tf.cast(indices, tf.uint32), keys, bits)
        walked = tf.while_loop(lambda values: tf.reduce_any(values >= limit), walk, (first,))[0]
        return tf.cast(walked, tf.int64)

    return permute
