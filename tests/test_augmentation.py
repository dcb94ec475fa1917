"""experiment.augmentation (tasks/augmentation/by_name.py): RandAugment per example, mixup and CutMix in the step, all
keyed by (SEED, example position): the same draws at 1, 2 and 4 replicas and across a resume, soft-target losses as
NumPy computes them, refusals before training, and XLA lowering (a TPU config's --preflight with them on).

The float64 weight invariance with randaugment + mixup is a case of tests/test_replica_invariance.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from common.errors import ConfigError
from helpers import checkpoint_values, run_train_py
from tasks.augmentation import by_name as augmentation
from tasks.augmentation import mixing
from tasks.augmentation.randaugment import OPS, RandAugment
from training.learning import losses
from training.trainer import Trainer

DIGITS_BATCH = 32  # Global; 8 per replica at 4 replicas.


def _mixed_batches(small_config, names, replicas, *, steps=2, partners=None):
    """{position: (mixed image, soft target)} of `steps` global batches drawn at `replicas` replicas (real
    MirroredStrategy on virtual CPUs, the tf.data pipeline), mixed by the Trainer's mixing in strategy.run.
    `partners`: a replacement for mixing.partners (the negative control)."""
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{index}" for index in range(replicas)],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    config = small_config(augmentation=tuple(names), global_batch_size=DIGITS_BATCH, train_data_on_device="never")
    trainer = Trainer(config, strategy)
    original = mixing.partners
    if partners is not None:
        mixing.partners = partners
    try:
        @tf.function
        def run(batch):
            mix = trainer.mixing or (lambda features, labels, positions: (features, tf.one_hot(labels, 10)))
            return strategy.run(lambda features, labels, positions: (*mix(features, labels, positions), positions),
                                args=batch)

        iterator = iter(strategy.distribute_datasets_from_function(trainer.train_input_fn()))
        drawn = {}
        for _ in range(steps):
            outputs = run(next(iterator))
            for images, targets, positions in zip(*(strategy.experimental_local_results(output)
                                                    for output in outputs), strict=True):
                for image, target, position in zip(images.numpy(), targets.numpy(), positions.numpy(), strict=True):
                    drawn[int(position)] = (image, target)
    finally:
        mixing.partners = original
    assert sorted(drawn) == list(range(steps * DIGITS_BATCH))
    return drawn


@pytest.mark.slow
@pytest.mark.parametrize("names", [("randaugment", "mixup"), ("flip_and_crop", "cutmix")])
def test_augmented_batches_are_the_same_at_1_2_and_4_replicas(small_config, names):
    """Every example's augmented, mixed image and soft target, compared by position: equal bit for bit."""
    reference = _mixed_batches(small_config, names, 1)
    for replicas in (2, 4):
        other = _mixed_batches(small_config, names, replicas)
        for position, (image, target) in reference.items():
            np.testing.assert_array_equal(other[position][0], image, err_msg=f"{replicas} replicas, {position}")
            np.testing.assert_array_equal(other[position][1], target, err_msg=f"{replicas} replicas, {position}")
    targets = np.stack([target for _, target in reference.values()])
    # Mixed: two labels per row, but for same-class pairs (~10%) and CutMix boxes that cover no 8x8 pixel.
    assert ((targets > 0).sum(axis=1) == 2).mean() > 0.7


@pytest.mark.slow
def test_a_pairing_by_per_replica_row_differs_across_replica_counts(small_config):
    """Negative control: pairing row i with row i + b/2 of the per-replica batch (b) changes with the replica
    count, and the comparison above sees it."""
    def half_batch_partners(tensor):
        return tf.roll(tensor, shift=tf.shape(tensor)[0] // 2, axis=0)

    one = _mixed_batches(small_config, ("mixup",), 1, partners=half_batch_partners)
    four = _mixed_batches(small_config, ("mixup",), 4, partners=half_batch_partners)
    differing = sum(not np.array_equal(one[position][0], four[position][0]) for position in one)
    assert differing > 0.9 * len(one)


def _cutmix_steps(drawn: dict, steps: int) -> list[bool]:
    """Per step of `_mixed_batches`' result: whether CutMix mixed it. CutMix's target weights are shares of the 64
    pixels of a digit (multiples of 1/64); mixup's lambda is continuous (never all 32 rows on that grid)."""
    kinds = []
    for step in range(steps):
        weights = np.stack([drawn[position][1] for position in range(step * DIGITS_BATCH, (step + 1) * DIGITS_BATCH)])
        kinds.append(bool(np.allclose(weights * 64, np.round(weights * 64), atol=1e-4)))
    return kinds


@pytest.mark.slow
def test_mixup_and_cutmix_switch_per_batch_the_same_at_1_2_and_4_replicas(small_config):
    """['randaugment', 'mixup', 'cutmix']: each global batch is mixed by one of the two (all its rows alike), both
    occur, the choice is the hash of (SEED, step) that MixupOrCutmix.cutmix_drawn gives, and every example's image
    and target is the same bit for bit at 1, 2 and 4 replicas."""
    names, steps = ("randaugment", "mixup", "cutmix"), 6
    reference = _mixed_batches(small_config, names, 1, steps=steps)
    kinds = _cutmix_steps(reference, steps)
    switch = mixing.mixup_or_cutmix()
    assert kinds == [bool(switch.cutmix_drawn(tf.constant([step * DIGITS_BATCH], tf.int64), seed=0,
                                              global_batch_size=DIGITS_BATCH)) for step in range(steps)]
    assert any(kinds) and not all(kinds), kinds
    for replicas in (2, 4):
        other = _mixed_batches(small_config, names, replicas, steps=steps)
        for position, (image, target) in reference.items():
            np.testing.assert_array_equal(other[position][0], image, err_msg=f"{replicas} replicas, {position}")
            np.testing.assert_array_equal(other[position][1], target, err_msg=f"{replicas} replicas, {position}")


@pytest.mark.slow
def test_a_switch_keyed_per_replica_differs_across_replica_counts(small_config, monkeypatch):
    """Negative control: a choice keyed by each replica's own first position (not the step) picks differently on
    the replicas of one step, and the comparison above sees it."""
    def per_replica(self, positions, *, seed, global_batch_size):
        draw = mixing.hashed_uniforms(mixing.keys_from_positions(seed + mixing.SWITCH_SALT, positions[:1]), 1)
        return draw[0, 0] < self.cutmix_probability

    monkeypatch.setattr(mixing.MixupOrCutmix, "cutmix_drawn", per_replica)
    one = _mixed_batches(small_config, ("mixup", "cutmix"), 1, steps=4)
    four = _mixed_batches(small_config, ("mixup", "cutmix"), 4, steps=4)
    assert any(not np.array_equal(one[position][1], four[position][1]) for position in one)


@pytest.mark.parametrize("probability", [0.0, 0.25, 0.5, 1.0])
def test_the_share_of_cutmix_batches_is_the_probability(probability):
    """4,000 steps: the share of CutMix steps within 0.03 of cutmix_probability (4 binomial sd at 0.5; the draws are
    a fixed function of (SEED, step), so this cannot flake); 0 and 1 exactly. Different SEEDs choose differently."""
    switch = mixing.mixup_or_cutmix(cutmix_probability=probability)

    def drawn(seed):
        return tf.function(lambda: tf.map_fn(
            lambda step: switch.cutmix_drawn(step[tf.newaxis] * 64, seed=seed, global_batch_size=64),
            tf.range(4000, dtype=tf.int64), fn_output_signature=tf.bool))()

    first, second = drawn(0).numpy(), drawn(1).numpy()
    assert abs(first.mean() - probability) < (0.03 if 0 < probability < 1 else 1e-12)
    if 0 < probability < 1:
        assert (first != second).mean() > 0.2


def test_mixed_images_and_targets_against_numpy():
    """mixup: x = w x_own + (1 - w) x_partner with the target weights w >= 1/2; CutMix: the share of pixels taken
    from the partner is the partner's target weight, exactly. Partners are rows 2k, 2k + 1 (positions p, p XOR 1)."""
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(64, 8, 8, 1)).astype(np.float32)
    labels = np.arange(64) % 10
    positions = tf.range(64, 128, dtype=tf.int64)
    partner = np.arange(64) ^ 1
    for kind in ("mixup", "cutmix"):
        mixed, targets = mixing.Mixing(kind, 1.0)(tf.constant(images), tf.constant(labels), positions, seed=3,
                                                  num_classes=10)
        mixed, targets = mixed.numpy(), targets.numpy()
        own = targets[np.arange(64), labels]
        np.testing.assert_allclose(targets.sum(axis=1), 1.0, atol=1e-6)
        np.testing.assert_allclose(targets[np.arange(64), labels[partner]], 1.0 - own, atol=1e-6)
        assert (own >= 0.5).all() and (own < 1.0).mean() > 0.9  # Dominant own label; really mixed.
        if kind == "mixup":
            expected = own[:, None, None, None] * images + (1 - own[:, None, None, None]) * images[partner]
            np.testing.assert_allclose(mixed, expected, atol=1e-6)  # float32 rounding of one multiply-add.
        else:
            from_partner = (mixed == images[partner]) & (mixed != images)
            np.testing.assert_allclose(from_partner.mean(axis=(1, 2, 3)), 1.0 - own, atol=1e-6)
            # Negative control: the weights are not those of another row.
            assert not np.allclose(from_partner.mean(axis=(1, 2, 3)), 1.0 - own[::-1], atol=1e-3)


@pytest.mark.parametrize("alpha", [0.2, 1.0, 4.0])
def test_lambda_follows_beta_alpha_alpha(alpha):
    """20,000 pair keys: the folded lambda max(l, 1 - l) against 200,000 NumPy Beta(alpha, alpha) draws folded the
    same way; Kolmogorov-Smirnov distance < 0.02 (the 1% critical value is 0.012; draws are a fixed function of the
    keys, so this cannot flake). Control: Beta(2 alpha, 2 alpha) is further away than 0.04."""
    drawn = tf.function(mixing.beta_draws)(tf.cast(tf.range(20_000) * 7919, tf.uint32), alpha).numpy()
    folded = np.sort(np.maximum(drawn, 1 - drawn))
    rng = np.random.default_rng(0)

    def distance(reference):
        reference = np.sort(np.maximum(reference, 1 - reference))
        grid = np.linspace(0.5, 0.999, 500)  # Below 1: float32 rounds the extremes to 1.0.
        return np.abs(np.searchsorted(folded, grid) / len(folded)
                      - np.searchsorted(reference, grid) / len(reference)).max()

    assert distance(rng.beta(alpha, alpha, 200_000)) < 0.02
    assert distance(rng.beta(2 * alpha, 2 * alpha, 200_000)) > 0.04


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_soft_target_cross_entropy_against_numpy(smoothing):
    """-sum t log softmax(z), targets smoothed t (1 - eps) + eps / C; float64 to 1e-12. One-hot targets give the
    integer-label loss (float32, 1e-6); smoothing then mixing = mixing then smoothing."""
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(16, 10)) * 3
    weights = rng.uniform(0.5, 1.0, 16)[:, None]
    labels, partner_labels = rng.integers(0, 10, 16), rng.integers(0, 10, 16)
    targets = weights * np.eye(10)[labels] + (1 - weights) * np.eye(10)[partner_labels]
    smoothed = targets * (1 - smoothing) + smoothing / 10
    log_softmax = logits - logits.max(1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(1, keepdims=True))
    expected = -(smoothed * log_softmax).sum(1)
    loss = losses.softmax_cross_entropy(tf.constant(targets), tf.constant(logits), label_smoothing=smoothing)
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-12)
    assert not np.allclose(expected, -(np.eye(10)[labels] * log_softmax).sum(1), rtol=1e-3)  # Control: mixed.
    hard = losses.softmax_cross_entropy(tf.constant(labels), tf.constant(logits, tf.float32),
                                        label_smoothing=smoothing)
    soft = losses.softmax_cross_entropy(tf.constant(np.eye(10)[labels], tf.float32), tf.constant(logits, tf.float32),
                                        label_smoothing=smoothing)
    np.testing.assert_allclose(soft.numpy(), hard.numpy(), rtol=1e-6)


def test_randaugment_draws_per_example_and_keeps_shapes():
    """Each op keeps the shape and [0, 1]; the ops drawn are a function of the seed only and cover OPS evenly."""
    augment = RandAugment(num_layers=2, magnitude=9)
    image = tf.random.stateless_uniform([8, 8, 1], seed=[0, 0])
    for op in OPS.values():
        out = op(image, tf.constant(0.9), tf.constant(-1.0))
        assert out.shape == image.shape and 0.0 <= float(tf.reduce_min(out)) <= float(tf.reduce_max(out)) <= 1.0
    indices = np.stack([augment.op_indices(tf.constant([5, position], tf.int64)).numpy() for position in range(1100)])
    counts = np.bincount(indices.ravel(), minlength=len(OPS))
    assert counts.min() > 0.7 * counts.mean()  # 2,200 draws over 11 ops: ~200 each, sd ~14.
    np.testing.assert_array_equal(augment.op_indices(tf.constant([5, 7], tf.int64)), indices[7])
    outputs = [augment(image, tf.constant([5, position], tf.int64)).numpy() for position in range(8)]
    assert sum(not np.array_equal(outputs[0], other) for other in outputs[1:]) >= 6  # Each example its own.


def test_randaugment_and_mixing_compile_with_xla():
    """Both lower to XLA (what a TPU runs) and give what they give without it (nearest-neighbour sampling: exact)."""
    augment = RandAugment(num_layers=3, magnitude=10)
    images = tf.random.stateless_uniform([16, 8, 8, 1], seed=[0, 1])
    seeds = tf.stack([tf.zeros(16, tf.int64), tf.range(16, dtype=tf.int64)], axis=1)

    def both(images, seeds):
        augmented = tf.map_fn(lambda args: augment(*args), (images, seeds), fn_output_signature=tf.float32)
        return mixing.Mixing("cutmix", 1.0)(augmented, tf.range(16) % 10, seeds[:, 1], seed=0, num_classes=10)

    compiled = tf.function(both, jit_compile=True)(images, seeds)
    for xla, plain in zip(compiled, tf.function(both)(images, seeds), strict=True):
        np.testing.assert_allclose(xla.numpy(), plain.numpy(), atol=1e-5)


def test_refusals_name_the_setting_and_the_fix(small_config):
    task = Trainer(small_config(), tf.distribute.get_strategy()).task
    cases = {("blur",): "Known augmentations: cutmix, flip_and_crop, mixup, randaugment",
             ("Mixup",): r"entry 'Mixup' \(did you mean 'mixup'\?\)", ("mixup", "mixup"): "twice"}
    for names, phrase in cases.items():
        with pytest.raises(ConfigError, match=phrase):
            augmentation.resolve(names, task, dataset="digits", rows_per_batch=8)
    with pytest.raises(ConfigError, match=r"odd 3 rows \(GLOBAL_BATCH_SIZE / replicas"):
        augmentation.resolve(("cutmix",), task, dataset="digits", rows_per_batch=3)
    assert augmentation.resolve(("randaugment",), task, dataset="digits", rows_per_batch=3)[1] is None  # Per example.
    with pytest.raises(ConfigError, match="randaugment.magnitude=11"):
        augmentation.randaugment(magnitude=11)
    with pytest.raises(ConfigError, match="mixup.alpha=0"):
        mixing.mixup(alpha=0)
    assert isinstance(augmentation.resolve(("mixup", "cutmix"), task, dataset="digits", rows_per_batch=8)[1],
                      mixing.MixupOrCutmix)  # Both: one per batch (below), no longer refused.
    with pytest.raises(ConfigError, match=r"mixup_or_cutmix.cutmix_probability=1.5 must be a number in \[0, 1\]"):
        mixing.mixup_or_cutmix(cutmix_probability=1.5)


@pytest.mark.parametrize("dataset", ["breast_cancer", "synthetic_reviews"])
def test_augmentation_of_a_task_that_takes_none_is_refused_before_the_dataset_is_prepared(small_config, tmp_path,
                                                                                         dataset):
    """Asked of the registered task (tasks/ `augmentations`) before builders.load_builder: the empty DATA_DIR stays
    empty. Negative control: the same DATA_DIR without the setting gets the dataset prepared in it."""
    data_dir = tmp_path / "tfds"
    data_dir.mkdir()
    config = small_config(dataset=dataset, data_dir=str(data_dir), augmentation=("randaugment", "mixup"))
    with pytest.raises(ConfigError) as error:
        Trainer(config, tf.distribute.get_strategy())
    assert (f"experiment.augmentation=['randaugment', 'mixup']: DATASET='{dataset}' is a "
            f"{'TabularClassification' if dataset == 'breast_cancer' else 'TextClassification'} task, which takes none"
            in str(error.value)) and "Remove 'randaugment', 'mixup' (or set experiment.augmentation=[])" \
        in str(error.value)
    assert not list(data_dir.iterdir())  # Nothing prepared.
    from data import builders
    from data.registry import get_dataset_spec

    spec = get_dataset_spec(dataset)
    assert augmentation.check([], spec.task, dataset=dataset) == ()  # [] (none) is fine for any task.
    builders.load_builder(spec, str(data_dir))
    assert list(data_dir.iterdir())  # The control: this is where preparing writes.


def test_every_name_a_task_takes_is_a_registered_augmentation():
    """tasks/ say which names they take; each is one tasks/augmentation/by_name.py resolves (image classification:
    all)."""
    from tasks.base import Task
    from tasks.image_classification import ImageClassification

    kinds = {ImageClassification, *Task.__subclasses__()}
    assert all(set(kind.augmentations) <= set(augmentation.AUGMENTATIONS) for kind in kinds)
    assert set(ImageClassification.augmentations) == set(augmentation.AUGMENTATIONS)


def test_an_unknown_name_exits_2_before_training(data_dir):
    result = run_train_py("--gin_param=experiment.augmentation=['mixup', 'blur']", "--gin_param=TRAIN_STEPS=10",
                          "--model_dir=/nonexistent/never_written")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "'blur'" in result.stderr and "Known augmentations: cutmix, flip_and_crop, mixup, randaugment" \
        in result.stderr


# Constant rate (the shipped peak): a cosine schedule depends on TRAIN_STEPS, which the first segment sets to 10.
RESUME = ["--gin_param=experiment.augmentation=['randaugment', 'mixup', 'cutmix']", "--gin_param=STEPS_PER_LOOP=5",
          "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=0",
          f"--gin_param=GLOBAL_BATCH_SIZE={DIGITS_BATCH}",
          "--gin_param=experiment.lr_schedule='constant'", "--gin_param=LEARNING_RATE=0.05"]


@pytest.mark.slow
def test_resume_continues_the_augmented_run_bit_for_bit(tmp_path, data_dir):
    """20 steps straight vs 10 + resume + 10, RandAugment and mixup or CutMix per batch on (the shipped CNN's peak
    learning rate; both kinds are drawn in each half): every weight and optimizer slot equal bit for bit. Control:
    another SEED differs."""
    switch = mixing.mixup_or_cutmix()
    kinds = [bool(switch.cutmix_drawn(tf.constant([step * DIGITS_BATCH], tf.int64), seed=0,
                                      global_batch_size=DIGITS_BATCH)) for step in range(20)]
    assert len(set(kinds[:10])) == len(set(kinds[10:])) == 2, kinds
    straight, interrupted, reseeded = (str(tmp_path / name) for name in ("straight", "interrupted", "reseeded"))
    for args in ((f"--model_dir={straight}", "--gin_param=TRAIN_STEPS=20"),
                 (f"--model_dir={interrupted}", "--gin_param=TRAIN_STEPS=10"),
                 (f"--model_dir={interrupted}", "--gin_param=TRAIN_STEPS=20"),
                 (f"--model_dir={reseeded}", "--gin_param=TRAIN_STEPS=20", "--gin_param=SEED=1")):
        result = run_train_py(*RESUME, *args)
        assert result.returncode == 0, result.stderr[-3000:]
    resumed, uninterrupted = checkpoint_values(interrupted), checkpoint_values(straight)
    assert resumed.keys() == uninterrupted.keys() and len(resumed) > 5
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)
    other = checkpoint_values(reseeded)
    assert sum(not np.array_equal(other[key], uninterrupted[key]) for key in uninterrupted) > len(uninterrupted) // 2


@pytest.mark.slow
def test_a_tpu_config_with_augmentation_passes_the_preflight(tmp_path):
    """configs/tpu/cifar10_resnet_v3_8.gin (8 replicas) with flip-and-crop, RandAugment and mixup: the train step
    and the augmentation compile with XLA (TFDS's mock CIFAR-10: no internet here). In this process, as
    tests/test_preflight.py runs the shipped TPU configs: the preflight builds one replica's share."""
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=4096):
        result = run_train_py("--gin_file=configs/tpu/cifar10_resnet_v3_8.gin", "--preflight",
                              "--gin_param=experiment.augmentation=['flip_and_crop', 'randaugment', 'mixup']",
                              f"--gin_param=DATA_DIR='{tmp_path}/data'", f"--model_dir={tmp_path}/run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for check in ("train step compiles with XLA", "augmentation compiles with XLA"):
        assert f"ok   {check}" in result.stdout, result.stdout
