"""The epoch permutation (common/keyed_random.epoch_permutation): a bijection of [0, n) for every size, the same
integers under XLA as on the host, well mixed, and pinned (a run resumed by a newer checkout must draw the same
examples).

The statistical checks are deterministic (fixed seeds and epochs): each passes or fails the same way every time. Their
thresholds sit at about one chance in a million for a truly random permutation; the one-round network (a poor mix)
fails them by orders of magnitude, so they can fail.
"""

import numpy as np
import pytest
import tensorflow as tf

from common import keyed_random

# Sizes with every shape of domain: 1 and 2 (the smallest network), odd and even, just under, at and over powers of
# two and of four (where the halves' width h changes), primes, and 10**6.
LARGE_SIZES = [255, 256, 257, 1023, 1024, 1025, 4095, 4097, 65535, 65536, 65537, 99_991, 262_145, 999_983, 10 ** 6]


def _permutation(size: int, *, seed: int = 7, epoch: int = 3, rounds: int | None = None) -> np.ndarray:
    return keyed_random.epoch_permutation(tf.range(size, dtype=tf.int64), seed=seed, epoch=epoch, size=size,
                               rounds=rounds).numpy()


def test_a_bijection_for_every_size_up_to_300_and_large_odd_and_even_ones():
    """Sizes up to 300 run op by op, without XLA (one compile per size would take minutes; the test below shows both
    give the same integers); the large ones as shipped, compiled."""
    for size in [*range(1, 301), *LARGE_SIZES]:
        if size <= 300:
            body = keyed_random._compiled_permutation(size, keyed_random.rounds_for(size)).python_function
            images = body(tf.range(size, dtype=tf.int64), tf.constant(7, tf.int64), tf.constant(3, tf.int64)).numpy()
        else:
            images = _permutation(size)
        assert images.dtype == np.int64
        np.testing.assert_array_equal(np.sort(images), np.arange(size), err_msg=f"size {size}")


def test_seeds_and_epochs_give_other_permutations_and_broadcast_against_the_indices():
    base = _permutation(1437)
    assert not np.array_equal(base, _permutation(1437, epoch=4))
    assert not np.array_equal(base, _permutation(1437, seed=8))
    assert not np.array_equal(_permutation(1437, seed=2 ** 32 + 7), _permutation(1437, seed=7))  # Every seed bit.
    epochs = tf.constant([3, 4], tf.int64)[:, None] * tf.ones([1, 1437], tf.int64)
    both = keyed_random.epoch_permutation(tf.tile(tf.range(1437, dtype=tf.int64)[None], [2, 1]), seed=7, epoch=epochs,
                               size=1437).numpy()
    np.testing.assert_array_equal(both, [base, _permutation(1437, epoch=4)])


def test_the_same_integers_compiled_by_xla_or_not():
    """What lets a TPU draw the host pipeline's batches: epoch_permutation runs compiled by XLA everywhere; its body
    run op by op, without XLA (as a backend that fuses nothing would), gives the same integers."""
    compiled = keyed_random._compiled_permutation(50_000, keyed_random.rounds_for(50_000))
    assert "while" in compiled.experimental_get_compiler_ir(tf.range(8, dtype=tf.int64), tf.constant(7, tf.int64),
                                                            tf.constant(0, tf.int64))(stage="hlo")
    op_by_op = tf.function(compiled.python_function)  # The same graph, run by TensorFlow's executor.
    for epoch in (0, 1, 2 ** 40):
        arguments = (tf.range(50_000, dtype=tf.int64), tf.constant(7, tf.int64), tf.constant(epoch, tf.int64))
        np.testing.assert_array_equal(op_by_op(*arguments), _permutation(50_000, epoch=epoch))
        np.testing.assert_array_equal(compiled(*arguments), _permutation(50_000, epoch=epoch))


def test_the_order_is_pinned():
    """The first images of (SEED=0, epoch 0) over the 1,437 digits and (SEED=7, epoch 3) over CIFAR-10's 50,000: a
    change to the permutation changes the data order of every run, and a run resumed across that change would
    train on other examples than it would have. Change these only with a note in docs/data.md."""
    np.testing.assert_array_equal(_permutation(1437, seed=0, epoch=0)[:8], PINNED_DIGITS)
    np.testing.assert_array_equal(_permutation(50_000)[:8], PINNED_CIFAR)


PINNED_DIGITS = [1045, 1353, 765, 22, 931, 290, 820, 525]
PINNED_CIFAR = [19399, 15413, 31432, 651, 45600, 48321, 10205, 43083]


def _position_table(size: int, permutations: int, rounds: int | None) -> np.ndarray:
    """counts[i, j]: how many of `permutations` epochs send i to j."""
    epochs = tf.repeat(tf.range(permutations, dtype=tf.int64), size)
    indices = tf.tile(tf.range(size, dtype=tf.int64), [permutations])
    images = keyed_random.epoch_permutation(indices, seed=11, epoch=epochs, size=size, rounds=rounds).numpy()
    table = np.zeros((size, size), np.int64)
    np.add.at(table, (indices.numpy(), images), 1)
    return table


def _chi_square_excess(table: np.ndarray) -> float:
    """How many standard deviations Pearson's chi-square of a permutation table (counts[i, j] over N permutations of
    n, all cells equally likely) is above its mean. Each permutation puts one count in every row and every column,
    so a cell varies as Binomial(N, 1/n) and the statistic is n / (n - 1) times a chi-square of (n - 1)**2 degrees
    of freedom: it is scaled back before comparing."""
    size = table.shape[0]
    expected = table.sum() / table.size
    degrees = (size - 1) ** 2
    statistic = float(((table - expected) ** 2 / expected).sum()) * (size - 1) / size
    return (statistic - degrees) / np.sqrt(2 * degrees)


def _mixing_problems(rounds: int | None) -> list[str]:
    """What differs from a uniformly random permutation beyond chance, [] if nothing."""
    problems = []
    # Every index equally likely at every place: chi-square of the table over 100,000 permutations of 10 (a 16-integer
    # domain) and 20,000 of 40 (64), within 5 standard deviations of its mean (about 1e-6 by chance; measured 16
    # rounds at 2, 3, 5, 7, 10 and 16 over 400,000: within 0.9; 6 rounds at 17, 40, 64, 100 over
    # 100,000: within 1.4).
    for size, permutations in ((10, 100_000), (40, 20_000)):
        excess = _chi_square_excess(_position_table(size, permutations, rounds))
        if excess > 5:
            problems.append(f"places of {size}: chi-square {excess:.1f} standard deviations above its mean")
    # Fixed points: Poisson(1) per permutation; the mean over 2,000 permutations of 1,000 has sd 0.022.
    fixed = _position_table(1000, 2000, rounds).diagonal().sum() / 2000
    if abs(fixed - 1) > 0.11:
        problems.append(f"fixed points: {fixed:.3f} per permutation, not 1")
    # No order kept: the correlation of i and its image over 10**5 has sd 1 / sqrt(10**5) = 0.0032, and so has that
    # of neighbours' images (i and i + 1 sent far apart, independently); 5 sd.
    images = _permutation(100_000, rounds=rounds).astype(np.float64)
    for name, pair in (("index and image", (np.arange(100_000), images)), ("neighbours", (images[:-1], images[1:]))):
        correlation = np.corrcoef(*pair)[0, 1]
        if abs(correlation) > 0.016:
            problems.append(f"{name}: correlation {correlation:.4f}")
    return problems


def test_it_is_well_mixed():
    assert _mixing_problems(None) == []


def test_negative_controls_fewer_rounds_fail_the_mixing_checks():
    """One round keeps half the bits' order; six on a 16-integer domain leave places uneven (16 standard deviations
    over 100,000 permutations of 10, measured: why small domains take 16)."""
    assert len(_mixing_problems(1)) >= 3, _mixing_problems(1)
    assert _chi_square_excess(_position_table(10, 100_000, keyed_random.ROUNDS)) > 5


@pytest.mark.parametrize("size", [0, keyed_random.MAX_SIZE + 1])
def test_sizes_outside_its_range_are_refused(size):
    with pytest.raises(ValueError, match=f"size={size}"):
        keyed_random.epoch_permutation(tf.range(1, dtype=tf.int64), seed=0, epoch=0, size=size)
