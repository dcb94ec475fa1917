"""experiment.jit_compile (training/jit_compile.py): 'on' compiles each replica's forward and backward pass with XLA
and trains the same weights as 'off' in float64; where it cannot work it is refused before training; 'auto' follows
the benchmark (docs/throughput.md) and says what it chose; TPUs ignore it; the preflight still compiles.

The float64 agreement is measured as the replica-invariance check measures (training/replica_invariance.py: its L2 and
binding clip forced on, the shipped learning rate and schedule, past the warm-up): worst tensor within 1e-9 relative.
Measured here: 3.0e-15 (cnn, 1 replica) and 6.3e-16 (mlp, 2 replicas) after 60 steps; the negative control (a
learning rate 1e-6 larger, no XLA) differs by far more than the tolerance, so the check can fail.
"""

import logging

import pytest
import tensorflow as tf

from common.errors import ConfigError
from helpers import run_train_py, shipped_config
from training import preflight, replica_invariance
from training.trainer import Trainer

DEFAULT = "configs/default.gin"
MLP = "configs/experiments/digits_mlp.gin"
TOLERANCE = 1e-9  # float64: exact-math-equal computations agree to ~1e-15 (XLA fuses and reorders, no more).
# (gin file, replica count, model options): the CNN's BatchNormalization unsynchronized (synchronized BN under
# MirroredStrategy is refused with 'on'); the MLP at 2 replicas (the cross-replica sum outside XLA).
AGREEMENT_CASES = {"cnn-1-replica": (DEFAULT, 1, {"synchronized_batch_norm": False}), "mlp-2-replicas": (MLP, 2, {})}



def _trained(config_file: str, replicas: int, model_options: dict, *params: str) -> replica_invariance.ReplicaRun:
    """The run of the replica-invariance check's probe at `replicas` replicas, float64, past the warm-up."""
    config = shipped_config(config_file, *params)
    runs, _ = replica_invariance.measure(config, [replicas], steps=replica_invariance.default_steps(),
                                         model_options=model_options)
    return runs[0]


def _worst_difference(reference: replica_invariance.ReplicaRun, other: replica_invariance.ReplicaRun) -> float:
    """The invariance check's figure (worst tensor, relative, floored at 1% of the largest weight), and the loss."""
    replica_invariance.compare([reference, other])
    return max(other.worst_difference, other.loss_difference)


@pytest.fixture(scope="module")
def mlp_off_at_2(data_dir):
    return _trained(MLP, 2, {})


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(AGREEMENT_CASES))
def test_on_trains_the_same_weights_as_off_in_float64(data_dir, mlp_off_at_2, case):
    config_file, replicas, options = AGREEMENT_CASES[case]
    off = mlp_off_at_2 if case == "mlp-2-replicas" else _trained(config_file, replicas, options)
    on = _trained(config_file, replicas, options, "experiment.jit_compile='on'")
    assert replica_invariance.default_steps() >= 40
    assert _worst_difference(off, on) <= TOLERANCE, (on.worst_tensor, on.worst_difference, on.loss_difference)


@pytest.mark.slow
def test_negative_control_a_learning_rate_1e_6_larger_fails_the_agreement(data_dir, mlp_off_at_2):
    learning_rate = shipped_config(MLP).learning_rate
    nudged = _trained(MLP, 2, {}, f"LEARNING_RATE={learning_rate * (1 + 1e-6)!r}")
    assert _worst_difference(mlp_off_at_2, nudged) > 100 * TOLERANCE


def _compiles_with_xla(trainer: Trainer) -> bool:
    """Whether the traced train step holds a function XLA must compile (the nested forward_backward)."""
    spec = trainer.train_input_fn()(tf.distribute.InputContext()).element_spec
    graph = tf.function(trainer.train_step).get_concrete_function(spec).graph.as_graph_def()
    nodes = [*graph.node, *(node for function in graph.library.function for node in function.node_def)]
    return any(node.attr["_XlaMustCompile"].b for node in nodes if "_XlaMustCompile" in node.attr)


def test_on_compiles_the_forward_and_backward_pass_and_off_does_not(small_config):
    on = Trainer(small_config(jit_compile="on"), tf.distribute.get_strategy())
    off = Trainer(small_config(), tf.distribute.get_strategy())
    assert on.jit_compile and _compiles_with_xla(on)
    assert not off.jit_compile and not _compiles_with_xla(off)  # Negative control: the graph check can say no.
    assert on.train(on.train_iterator(), 5)["loss"] > 0


def test_a_bad_value_is_a_config_error_naming_the_choices(small_config):
    with pytest.raises(ConfigError, match=r"experiment.jit_compile='yes' is not one of 'off', 'on', 'auto'; e.g. "
                                          r"--gin_param=\"experiment.jit_compile='off'\""):
        small_config(jit_compile="yes")


def test_a_bad_value_exits_2_before_training(tmp_path, data_dir):
    result = run_train_py("--gin_param=experiment.jit_compile=True", f"--model_dir={tmp_path / 'run'}", timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert ("experiment.jit_compile=True is not one of 'off', 'on', 'auto'; did you mean "
            "--gin_param=\"experiment.jit_compile='on'\"?") in result.stderr  # Not 'off', which True does not mean.
    assert not (tmp_path / "run").exists()


def test_on_refuses_synchronized_batch_norm_under_mirrored_and_accumulation(small_config):
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0"])
    with pytest.raises(ConfigError, match=r"2 synchronized BatchNormalization layer\(s\).*under MirroredStrategy "
                                          r"\(1 replica\(s\)\).*cnn.synchronized_batch_norm=False"):
        Trainer(small_config(model="cnn", jit_compile="on"), mirrored, model_options={"synchronized_batch_norm": True})
    with pytest.raises(ConfigError, match=r"ACCUMULATE_STEPS=2 \(the micro-batch loop is not compiled\)"):
        Trainer(small_config(jit_compile="on", accumulate_steps=2), tf.distribute.get_strategy())
    # What works: synchronized BatchNormalization on the default strategy (no cross-replica call to make).
    synchronized = Trainer(small_config(model="cnn", jit_compile="on"), tf.distribute.get_strategy(),
                           model_options={"synchronized_batch_norm": True})
    assert synchronized.jit_compile and synchronized.train(synchronized.train_iterator(), 2)["loss"] > 0


def test_auto_follows_the_benchmark_and_logs_why(small_config, caplog):
    caplog.set_level(logging.INFO, logger="training.jit_compile")
    assert Trainer(small_config(model="cnn", jit_compile="auto"), tf.distribute.get_strategy()).jit_compile
    assert ("experiment.jit_compile='auto': on (MODEL='cnn' at 1 replica(s) and 48 examples per replica trained "
            "faster with XLA") in caplog.text
    assert not Trainer(small_config(model="cnn", jit_compile="auto", global_batch_size=256),
                       tf.distribute.get_strategy()).jit_compile  # Where XLA slowed it (docs/throughput.md).
    assert "'auto': off (MODEL='cnn' was faster with XLA only up to 1 replica(s) and 64 examples" in caplog.text
    assert not Trainer(small_config(jit_compile="auto"), tf.distribute.get_strategy()).jit_compile
    assert "experiment.jit_compile='auto': off (MODEL='mlp' was not faster with XLA" in caplog.text
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0"])
    assert not Trainer(small_config(model="cnn", jit_compile="auto"), mirrored,
                       model_options={"synchronized_batch_norm": True}).jit_compile  # 'on' would be refused here.
    assert "'auto': off (2 synchronized BatchNormalization" in caplog.text


def test_tpu_configs_ignore_it_and_the_preflight_still_compiles(small_config, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="training.jit_compile")
    tpu = Trainer(small_config(strategy="tpu", jit_compile="on"), tf.distribute.get_strategy())
    assert not tpu.jit_compile and "jit_compile='on': ignored on TPUs" in caplog.text
    config = small_config(target_replicas=4, global_batch_size=64, jit_compile="on")
    checks = preflight.run_preflight(config, str(tmp_path))
    assert {check.name: check.problem for check in checks if check.problem} == {}
    assert "train step compiles with XLA" in [check.name for check in checks]
