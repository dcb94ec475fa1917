"""Gradient accumulation (ACCUMULATE_STEPS=k, training/learning/accumulation.py) is exact: in float64, k = 1, 2, 4 at
1, 2, 4 replicas and the same global batch end with the same weights to 1e-9 after leaving the shipped warm-up, on
the tf.data pipeline and on the on-device split; a planted bug (each micro-batch divided by its own size) fails
that; BatchNormalization at k > 1 trains, on per-micro-batch statistics; resume at k=2 is bit-exact; a batch that
does not divide by k x replicas is exit 2 before training. (tests/test_replica_invariance.py has the CASES entry.)"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from helpers import checkpoint_values, run_train_py, shipped_config
from training import replica_invariance
from training.learning import step

MLP = "configs/experiments/digits_mlp.gin"



def _measure(config, replicas, accumulate, **options):
    runs, probe = replica_invariance.measure(config, replicas, steps=replica_invariance.default_steps(),
                                             accumulate=accumulate, **options)
    passed, table = replica_invariance.report(runs, probe)
    print(table)
    return runs, passed, table


@pytest.mark.slow
def test_k_1_2_4_at_1_2_4_replicas_train_the_same_weights_on_the_tf_data_pipeline(data_dir):
    """Adam at its shipped 1e-3 (the CASES entry covers SGD, dropout and the on-device split)."""
    config = shipped_config(MLP, "experiment.optimizer='adam'", "LEARNING_RATE=0.001",
                            "experiment.train_data_on_device='never'")
    runs, passed, table = _measure(config, [1, 2, 4], [1, 2, 4])
    assert passed, table
    assert [(run.replicas, run.accumulate_steps) for run in runs] == [(r, k) for r in (1, 2, 4) for k in (1, 2, 4)]


def _micro_batch_mean(per_example_loss, global_batch_size):
    """The planted bug: the loss divided by this micro-batch's global size (G / k), not by the global batch."""
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    return tf.reduce_sum(per_example_loss) / tf.cast(per_example_loss.shape[0] * replicas, per_example_loss.dtype)


@pytest.mark.slow
def test_dividing_each_micro_batch_by_its_own_size_fails_the_equality(data_dir, monkeypatch):
    """Negative control: invisible at k=1 (there the micro-batch is the global batch) and across replicas at one k,
    a factor of k in the gradient at k > 1."""
    monkeypatch.setattr(step, "average_over_global_batch", _micro_batch_mean)
    runs, passed, table = _measure(shipped_config(MLP), [1, 2], [1, 2])
    assert not passed
    worst = {(run.replicas, run.accumulate_steps): run.worst_difference for run in runs}
    assert worst[(2, 1)] <= replica_invariance.TOLERANCE, table  # Replicas at k=1: still right.
    assert min(worst[(1, 2)], worst[(2, 2)]) > 1e4 * replica_invariance.TOLERANCE, table


@pytest.mark.slow
def test_batch_normalization_at_k_2_trains_on_per_micro_batch_statistics(small_config):
    """With BN, k=2 is not k=1: each micro-batch is normalised by its own statistics (and the moving averages move
    twice per step). It trains all the same, and the difference is in exactly those statistics."""
    from tpu_utils.strategy import make_strategy
    from training.trainer import Trainer

    results, initial = {}, None
    for k in (1, 2):
        trainer = Trainer(small_config(model="cnn", accumulate_steps=k, learning_rate=0.05, precision="float64"),
                          make_strategy("default"))
        if initial is None:
            initial = trainer.model.get_weights()
        trainer.model.set_weights(initial)
        first = trainer.train(trainer.train_iterator(), 1)["loss"]
        trainer.train(trainer.train_iterator(), 99)
        weights = [(variable.path, variable.numpy()) for variable in trainer.model.weights]
        results[k] = (first, trainer.evaluate(), weights)
    (first_1, eval_1, weights_1), (first_2, eval_2, weights_2) = results[1], results[2]
    # Same weights, same examples, and yet another loss from the first forward pass: normalised per micro-batch.
    assert first_2 != pytest.approx(first_1, rel=1e-9) and first_2 == pytest.approx(first_1, rel=0.05)
    assert eval_2["accuracy"] > 0.8 and eval_2["accuracy"] == pytest.approx(eval_1["accuracy"], abs=0.05)  # Trains.
    moving = [(one, two) for (path, one), (_, two) in zip(weights_1, weights_2, strict=True) if "moving_mean" in path]
    assert moving and all(not np.allclose(one, two, rtol=1e-6) for one, two in moving)


def test_k_1_builds_the_plain_step_and_k_2_the_accumulating_one(small_config):
    """The default run takes the k=1 code path it always took (its numbers stay bit-identical)."""
    from tpu_utils.strategy import make_strategy
    from training.trainer import Trainer

    plain = Trainer(small_config(), make_strategy("default")).train_step
    accumulating = Trainer(small_config(accumulate_steps=2), make_strategy("default")).train_step
    assert plain.__qualname__ == "make_train_step.<locals>.train_step"
    assert accumulating.__qualname__ == "make_accumulating_train_step.<locals>.train_step"


def test_metrics_count_every_micro_batch(small_config):
    """Training accuracy at k=4 counts the whole global batch: equal to k=1's from the same weights."""
    from tpu_utils.strategy import make_strategy
    from training.trainer import Trainer

    trainers = [Trainer(small_config(accumulate_steps=k, precision="float64"), make_strategy("default"))
                for k in (1, 4)]
    trainers[1].model.set_weights(trainers[0].model.get_weights())
    results = [trainer.train(trainer.train_iterator(), 5) for trainer in trainers]
    assert results[0]["accuracy"] == results[1]["accuracy"]
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], rel=1e-12)


def test_the_accumulating_step_refuses_activity_regularizers(small_config, monkeypatch):
    """A loss a layer adds in call() would count once per micro-batch: refused when the step is traced."""
    import keras

    from models import registry
    from tpu_utils.strategy import make_strategy
    from training.trainer import Trainer

    def active(input_shape, num_classes, **_):
        inputs = keras.Input(shape=input_shape)
        x = keras.layers.Dense(8, activity_regularizer=keras.regularizers.L2(1e-3))(keras.layers.Flatten()(inputs))
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))

    monkeypatch.setitem(registry.MODELS, "active", active)
    trainer = Trainer(small_config(model="active", accumulate_steps=2), make_strategy("default"))
    with pytest.raises(ValueError, match="ACCUMULATE_STEPS=2: the model adds losses in call"):
        trainer.train(trainer.train_iterator(), 1)


COMMON = ["--gin_param=STRATEGY='mirrored'", "--gin_param=VIRTUAL_DEVICES=2", "--gin_param=STEPS_PER_LOOP=5",
          "--gin_param=CHECKPOINT_EVERY=10", "--gin_param=EVAL_EVERY=10", "--gin_param=GLOBAL_BATCH_SIZE=32",
          "--gin_param=ACCUMULATE_STEPS=2", "--gin_param=experiment.optimizer='adam'",
          "--gin_param=experiment.lr_schedule='constant'", "--gin_param=LEARNING_RATE=0.01"]


@pytest.mark.slow
def test_resume_at_k_2_is_bit_exact_and_counts_optimizer_steps(tmp_path, data_dir):
    interrupted, straight = str(tmp_path / "interrupted"), str(tmp_path / "straight")
    assert run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=10", f"--model_dir={interrupted}").returncode == 0
    second = run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=20", f"--model_dir={interrupted}")
    assert second.returncode == 0, second.stderr
    assert "at step 10" in second.stdout  # global_step counts optimizer steps, not micro-batches.
    third = run_train_py(*COMMON, "--gin_param=TRAIN_STEPS=20", f"--model_dir={straight}")
    assert third.returncode == 0, third.stderr
    resumed, uninterrupted = checkpoint_values(interrupted), checkpoint_values(straight)
    assert resumed.keys() == uninterrupted.keys() and len(resumed) > 10
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)
    steps = [value for key, value in resumed.items() if key.startswith("step/")]
    assert [int(value) for value in steps] == [20]


@pytest.mark.parametrize("params, message", [
    (["GLOBAL_BATCH_SIZE=64", "ACCUMULATE_STEPS=3"],
     'error: GLOBAL_BATCH_SIZE=64 does not divide by ACCUMULATE_STEPS=3: every micro-batch must have the same size. '
     'Use a multiple of 3, e.g. --gin_param="GLOBAL_BATCH_SIZE=63", or another ACCUMULATE_STEPS.'),
    (["GLOBAL_BATCH_SIZE=64", "ACCUMULATE_STEPS=32", "STRATEGY='mirrored'", "VIRTUAL_DEVICES=4"],
     "error: GLOBAL_BATCH_SIZE=64 does not divide by ACCUMULATE_STEPS=32 x the 4 replicas of this strategy (128): "
     'each replica\'s micro-batch must be whole. Use a multiple of 128, e.g. --gin_param="GLOBAL_BATCH_SIZE=128", '
     "or a smaller ACCUMULATE_STEPS."),
    (["ACCUMULATE_STEPS=0"],
     'error: ACCUMULATE_STEPS=0 must be an integer >= 1; e.g. --gin_param="ACCUMULATE_STEPS=1".'),
])
def test_a_batch_that_does_not_divide_is_exit_2_naming_the_fix(tmp_path, data_dir, params, message):
    result = run_train_py(*[f"--gin_param={param}" for param in params], f"--model_dir={tmp_path / 'run'}")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == message
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("accumulate", ["1,x", "0,2", ""])
def test_bad_accumulate_exits_2_naming_the_value_and_the_fix(accumulate, capsys):
    assert replica_invariance.main(["replica_invariance", f"--gin_file={MLP}", f"--accumulate={accumulate}"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --accumulate={accumulate!r}: expected comma-separated "
                                               "integers >= 1, e.g. --accumulate=1,2,4.")


def test_the_config_carries_the_macro(small_config):
    assert dataclasses.replace(small_config(), accumulate_steps=4).accumulate_steps == 4
    assert shipped_config(MLP, "ACCUMULATE_STEPS=4").accumulate_steps == 4
    assert shipped_config(MLP).accumulate_steps == 1


def test_the_preflight_compiles_the_accumulating_step_with_xla_and_checks_k_x_replicas(small_config, tmp_path):
    """`--preflight` (the TPU check on CPU) XLA-compiles the k=4 step at 4 replicas; 64 examples do not split into
    32 micro-batches on each of 4 replicas."""
    from training import preflight

    config = small_config(target_replicas=4, global_batch_size=64, accumulate_steps=4)
    checks = preflight.run_preflight(config, str(tmp_path / "ok"))
    assert {check.name: check.problem for check in checks if check.problem} == {}
    assert any("XLA" in check.name or "compile" in check.name for check in checks), [c.name for c in checks]
    bad = preflight.run_preflight(dataclasses.replace(config, accumulate_steps=32), str(tmp_path / "bad"))
    problems = {check.name: check.problem for check in bad if check.problem}
    assert "ACCUMULATE_STEPS=32 x the 4 replicas" in problems["batch divides by the replicas"], problems


def test_mixed_float16_loss_scaling_at_k_2_trains_like_k_1(small_config):
    """Under dynamic loss scaling each micro-batch's loss is scaled, the scaled sum is checked and unscaled once."""
    from tpu_utils.strategy import make_strategy
    from training.trainer import Trainer

    losses, initial = [], None
    for k in (1, 2):
        trainer = Trainer(small_config(accumulate_steps=k, precision="mixed_float16"), make_strategy("default"))
        initial = trainer.model.get_weights() if initial is None else initial
        trainer.model.set_weights(initial)
        losses.append(trainer.train(trainer.train_iterator(), 20)["loss"])
    assert np.isfinite(losses).all() and losses[1] == pytest.approx(losses[0], rel=1e-2), losses
