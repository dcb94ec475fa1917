"""Settings at the edge of what the code can hold are refused with exit 2 and one `error:` line, not a traceback,
an overflow or a silent fallback: step counts (and ACCUMULATE_STEPS) above int32, SEED above NumPy's range, a momentum
of 1 or more, a gin file that is not UTF-8 text, an empty --model_dir or DATA_DIR, and a PROFILER_PORT that is out
of range or taken. Each limit's largest allowed value is accepted (the negative controls)."""

import os
import socket

import pytest

import train
from common.errors import ConfigError
from common.settings import MAX_STEPS
from helpers import run_train_py
from training.build_scope import MAX_SEED
from training.learning import optimizers
from training.observers.profiling import check_port_free

DIGITS = "configs/experiments/digits_mlp.gin"
STEP_SETTINGS = ("train_steps", "steps_per_loop", "checkpoint_every", "eval_every")


def fields(**overrides) -> dict:
    """Keyword arguments of a valid ExperimentConfig (not built here: no dataset is read), with `overrides`."""
    values = dict(model="mlp", dataset="digits", global_batch_size=48, train_steps=40, steps_per_loop=1,
                  checkpoint_every=0, eval_every=0, learning_rate=0.1, strategy="default")
    return {**values, **overrides}


def config(**overrides):
    from training.config import ExperimentConfig

    return ExperimentConfig(**fields(**overrides))


@pytest.mark.parametrize("name", STEP_SETTINGS)
def test_step_settings_are_bounded_by_int32(name):
    with pytest.raises(ConfigError) as error:
        config(**{"train_steps": MAX_STEPS, name: MAX_STEPS + 1})
    assert f"{name.upper()}={MAX_STEPS + 1} is above the limit {MAX_STEPS} (2**31 - 1: step counts are int32" \
        in str(error.value)
    assert "e.g. --gin_param=" in str(error.value)
    config(**{"train_steps": MAX_STEPS, name: MAX_STEPS})  # The limit itself is fine.


def test_accumulate_steps_is_bounded_by_int32_and_by_the_batch():
    """ACCUMULATE_STEPS counts micro-batches in an int32 loop, and each micro-batch needs an example: above either
    bound the message names ACCUMULATE_STEPS and a divisor of the batch, never a GLOBAL_BATCH_SIZE of 2**31.
    Negative controls: the largest k the batch allows (k = GLOBAL_BATCH_SIZE) and MAX_STEPS with a batch that big."""
    with pytest.raises(ConfigError) as error:
        config(accumulate_steps=MAX_STEPS + 1, global_batch_size=128)
    assert str(error.value) == ("ACCUMULATE_STEPS=2147483648 is above the limit 2147483647 (2**31 - 1: the micro-batch "
                                'loop counts in int32 on the device); e.g. --gin_param="ACCUMULATE_STEPS=1".')
    for too_many in (MAX_STEPS, 256):
        with pytest.raises(ConfigError) as error:
            config(accumulate_steps=too_many, global_batch_size=128)
        assert str(error.value) == (f"ACCUMULATE_STEPS={too_many} is more than GLOBAL_BATCH_SIZE=128, the examples of "
                                    "one step: each of its micro-batches needs at least one. Use a divisor of 128 "
                                    "(each micro-batch holds GLOBAL_BATCH_SIZE / ACCUMULATE_STEPS examples), e.g. "
                                    '--gin_param="ACCUMULATE_STEPS=2".')
    assert config(accumulate_steps=128, global_batch_size=128).accumulate_steps == 128
    assert config(accumulate_steps=MAX_STEPS, global_batch_size=MAX_STEPS, train_steps=1).accumulate_steps == MAX_STEPS


def test_profile_steps_are_bounded_by_int32():
    with pytest.raises(ConfigError, match=r"PROFILE_STEPS=\(0, 2147483648\) must be .* stop <= 2147483647"):
        config(profile_steps=(0, MAX_STEPS + 1))
    assert config(profile_steps=(0, MAX_STEPS)).profile_steps == (0, MAX_STEPS)


def test_steps_times_batch_must_fit_the_training_stream():
    with pytest.raises(ConfigError, match=r"TRAIN_STEPS=2147483647 x GLOBAL_BATCH_SIZE=4294967296 examples is more "
                                          r"than the training stream's 2\*\*62 positions"):
        config(train_steps=MAX_STEPS, global_batch_size=2 ** 32)
    config(train_steps=MAX_STEPS, global_batch_size=2 ** 31)  # 2**62 - 2**31: fits.


def test_seed_is_bounded_by_numpys_range():
    with pytest.raises(ConfigError, match=r"SEED=4294967296 is above the limit 4294967295 \(2\*\*32 - 1: NumPy's seed"):
        config(seed=MAX_SEED + 1)
    config(seed=MAX_SEED)


@pytest.mark.parametrize("port, expected", [
    (70000, "PROFILER_PORT=70000 is above the limit 65535 (the largest TCP port; 0 = off); e.g. "
            '--gin_param="PROFILER_PORT=6009"'),
    (-1, "PROFILER_PORT=-1 must be an integer >= 0"),
    ("6009", "PROFILER_PORT='6009' must be an integer >= 0"),
])
def test_profiler_port_is_a_tcp_port(port, expected):
    with pytest.raises(ConfigError) as error:
        config(profiler_port=port)
    assert expected in str(error.value)
    config(profiler_port=65535)


@pytest.mark.parametrize("data_dir", ["", "  "])
def test_an_empty_data_dir_is_refused(data_dir):
    with pytest.raises(ConfigError, match=r"DATA_DIR='\s*' is empty \(an unset variable in a script\?\): TFDS would "
                                          "build the data in the current directory"):
        config(data_dir=data_dir)
    assert config(data_dir=None).data_dir is None  # TFDS's default directory.


def test_a_data_dir_that_is_not_a_string_is_refused():
    with pytest.raises(ConfigError, match=r"DATA_DIR=5 must be a directory \(a string\) or None"):
        config(data_dir=5)


@pytest.mark.parametrize("name, value", [("sgd.momentum", 5.0), ("sgd.momentum", 1.0), ("sgd.momentum", -0.1),
                                         ("adam.beta_1", 1.0), ("adam.beta_2", 1.5), ("adamw.beta_1", -1)])
def test_decay_rates_must_be_in_0_1(name, value):
    optimizer, argument = name.split(".")
    with pytest.raises(ConfigError, match=rf"{name}={value!r} must be a number in \[0, 1\)"):
        optimizers.OPTIMIZERS[optimizer](0.1, **{argument: value})


def test_decay_rates_in_range_are_passed_on():
    assert optimizers.sgd(0.1, momentum=0.9).momentum == 0.9
    assert optimizers.sgd(0.1, momentum=0).momentum == 0.0  # An int: Keras itself wants a float.
    assert optimizers.adam(0.1, beta_1=0.5, beta_2=0.99).beta_2 == 0.99


def run_main(tmp_path, *args: str) -> int:
    """train.main on the digits config with `args`; a traceback would raise here."""
    return train.main(["train.py", f"--gin_file={DIGITS}", f"--model_dir={tmp_path / 'run'}", *args])


@pytest.mark.parametrize("gin_param, expected", [
    ("TRAIN_STEPS=18446744073709551616", "TRAIN_STEPS=18446744073709551616 is above the limit 2147483647"),
    ("STEPS_PER_LOOP=2147483648", "STEPS_PER_LOOP=2147483648 is above the limit 2147483647"),
    ("ACCUMULATE_STEPS=2147483648", "ACCUMULATE_STEPS=2147483648 is above the limit 2147483647"),
    ("SEED=4294967296", "SEED=4294967296 is above the limit 4294967295"),
    ("DATA_DIR=''", "DATA_DIR='' is empty"),
    ("PROFILER_PORT=70000", "PROFILER_PORT=70000 is above the limit 65535"),
])
def test_out_of_range_settings_exit_2_before_anything_is_built(gin_param, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Today's code builds DATA_DIR='' into the current directory.
    assert run_main(tmp_path, f"--gin_param={gin_param}") == 2
    assert expected in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run")  # Refused with the config: not even the run lock was taken.


@pytest.mark.parametrize("content, expected", [
    (bytes(range(256)) * 4, "is not UTF-8 gin text (byte 128 is 0x80)"),
    ("TRAIN_STEPS = 5  # caf\xe9\n".encode("latin-1"), "is not UTF-8 gin text (byte 22 is 0xe9)"),
    (b"TRAIN_STEPS = 5\n\x00\x01\x02", "is not gin text (it holds NUL bytes, at byte 16: a binary file?)"),
])
def test_a_gin_file_that_is_not_utf8_text_exits_2(content, expected, tmp_path, capsys):
    path = tmp_path / "config.gin"
    path.write_bytes(content)
    assert run_main(tmp_path, f"--gin_file={path}") == 2
    assert f"error: --gin_file='{path}' {expected}" in capsys.readouterr().err


def test_an_included_file_that_is_not_utf8_is_named_with_its_includer(tmp_path, capsys):
    (tmp_path / "binary.gin").write_bytes(b"\xff\xfe")
    (tmp_path / "main.gin").write_text(f"include '{tmp_path / 'binary.gin'}'\n")
    assert run_main(tmp_path, f"--gin_file={tmp_path / 'main.gin'}") == 2
    assert f"error: {tmp_path / 'binary.gin'} (included by {tmp_path / 'main.gin'}) is not UTF-8 gin text" \
        in capsys.readouterr().err


@pytest.mark.parametrize("model_dir", ["", "   "])
def test_an_empty_model_dir_exits_2(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Today's code would train into ./runs/digits_mlp.
    assert train.main(["train.py", f"--gin_file={DIGITS}", f"--model_dir={model_dir}"]) == 2
    assert f"error: --model_dir={model_dir!r} is empty (an unset variable in a script?)" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "runs")


def test_a_taken_profiler_port_exits_2_before_training(tmp_path, capsys, data_dir):
    with socket.socket() as taken:  # Loopback: the profiler server's [::] would include it.
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert run_main(tmp_path, f"--gin_param=PROFILER_PORT={port}") == 2
    err = capsys.readouterr().err
    assert f"error: PROFILER_PORT={port} is taken by another process on this host" in err
    assert "pick another, e.g. --gin_param=\"PROFILER_PORT=6009\", or 0 for no server." in err
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_a_free_port_passes_the_check():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    check_port_free(port)  # Free again once closed.
    check_port_free(0)  # Off.


def test_momentum_out_of_range_is_one_error_line_through_the_command_line(tmp_path, data_dir):
    """The deepest case: refused inside gin's call of the sgd configurable, while the Trainer is built."""
    result = run_train_py(f"--gin_file={DIGITS}", f"--model_dir={tmp_path}", "--gin_param=sgd.momentum=5.0")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ['error: sgd.momentum=5.0 must be a number in [0, 1) (0 <= momentum < 1); e.g. '
                      '--gin_param="sgd.momentum=0.9".'], result.stderr
