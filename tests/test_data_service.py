"""DATA_SERVICE (data/service.py): batches made by tf.data services are the batches the run makes itself, in the same
order, for any number of services; a resumed run starts them at its step; a service that is absent, dies or restarts
ends the run with exit 1 naming it, and the rerun resumes exactly.

Real parts: TensorFlow's own dispatcher and worker servers, in this process ('local') or in a `python -m
data.service` process on a 127.0.0.1 port (grpc://), killed with SIGKILL as a preempted machine would be.
"""

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import forked_python
from common.loopback import free_loopback_ports
from helpers import REPO_ROOT, checkpoint_values, run_train_py

BAD_SETTINGS = ["local:0", "local:x", "local:65", "grpc://", "grpc://10.0.0.5", "http://10.0.0.5:5050",
                "grpc://10.0.0.5:0", "grpc://a:1,grpc://a:1", "10.0.0.5:5050"]


@pytest.mark.parametrize("value", BAD_SETTINGS)
def test_a_bad_setting_is_refused_naming_it(value, data_dir):
    result = run_train_py("--model_dir=/nonexistent/never-written", f"--gin_param=DATA_SERVICE={value!r}",
                          f"--gin_param=DATA_DIR={data_dir!r}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"DATA_SERVICE={value!r}" in result.stderr and "e.g." in result.stderr, result.stderr


def pipeline_batches(services, *, start_step: int, count: int, pipelines: int = 1, pipeline_id: int = 0,
                     replicas: int = 2, global_batch_size: int = 64, spec_builder=None):
    """The first `count` per-replica batches of one input pipeline of the digits train stream (or `spec_builder`'s),
    with `services` or without (None)."""
    import tensorflow as tf

    from data import builders, pipeline
    from data.registry import get_dataset_spec

    spec, builder = spec_builder or (get_dataset_spec("digits"), None)
    builder = builder or builders.load_builder(spec, os.environ["TFDS_DATA_DIR"])
    input_fn = pipeline.make_train_input_fn(spec, builder, global_batch_size=global_batch_size, seed=3,
                                            start_step=start_step, services=services)
    context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline_id,
                                         num_replicas_in_sync=replicas)
    return [tf.nest.map_structure(lambda tensor: tensor.numpy(), batch)
            for batch in input_fn(context).take(count)]


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        for part, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            assert a.dtype == b.dtype and np.array_equal(a, b), f"batch {index}, part {part} differs"


def test_services_make_the_same_batches_in_the_same_order(data_dir):
    """Two services: bit for bit the run's own batches at a resumed step, also for one of two hosts' pipelines."""
    from data import service

    with service.started(service.parse("local:2"), timeout_seconds=30) as services:
        for start_step, pipelines, pipeline_id in ((7, 1, 0), (5, 2, 1)):
            got = pipeline_batches(services, start_step=start_step, count=6, pipelines=pipelines,
                                   pipeline_id=pipeline_id)
            expected = pipeline_batches(None, start_step=start_step, count=6, pipelines=pipelines,
                                        pipeline_id=pipeline_id)
            assert_same_batches(got, expected)


@pytest.mark.parametrize("setting", ["local", "local:3"])
def test_every_position_of_two_epochs_arrives_once_in_order(setting, data_dir):
    """From the start, 1 and 3 services: the run's own batches, and every position of two epochs exactly once, in
    order (so every example once per epoch: the epoch's permutation is a bijection, tests/test_permutation.py)."""
    from data import service

    two_epochs = -(-2 * 1437 // 32)  # Digits' 1,437 train examples, per-replica batches of 32, one pipeline.
    with service.started(service.parse(setting), timeout_seconds=30) as services:
        got = pipeline_batches(services, start_step=0, count=two_epochs)
    assert_same_batches(got, pipeline_batches(None, start_step=0, count=two_epochs))
    positions = np.concatenate([batch[2] for batch in got])
    assert np.array_equal(positions, np.arange(len(positions))), "a position missing, repeated or out of order"


def test_services_make_the_shard_streams_batches(tmp_path):
    """The stream read by shard file (ImageNet's way; here digits in 7 shard files): each of two services reads
    every block and decodes only its own batches; together the run's own batches, in order."""
    import tensorflow_datasets as tfds

    from data import builders, service
    from data.registry import get_dataset_spec

    spec = dataclasses.replace(get_dataset_spec("digits"), read_by_shard=True)
    builder = builders.find_builder(spec.tfds_name, str(tmp_path), module=spec.module)
    builders.prepare(builder, tfds.download.DownloadConfig(num_shards=7))
    with service.started(service.parse("local:2"), timeout_seconds=30) as services:
        got = pipeline_batches(services, start_step=3, count=6, global_batch_size=48, spec_builder=(spec, builder))
    expected = pipeline_batches(None, start_step=3, count=6, global_batch_size=48, spec_builder=(spec, builder))
    assert_same_batches(got, expected)


def test_a_batch_out_of_sequence_stops_the_run_with_one_line(data_dir):
    """Negative control of the order check: two services dealt in the wrong order (what a restarted service's
    replayed batches look like to the run) fail at the first batch, and the Trainer's message names it."""
    import tensorflow as tf

    from common.errors import InputServiceError
    from data import builders, pipeline, service
    from data.registry import get_dataset_spec

    spec = get_dataset_spec("digits")
    builder = builders.load_builder(spec, data_dir)
    make = pipeline.make_train_input_fn(spec, builder, global_batch_size=64, seed=3, start_step=0)
    context = tf.distribute.InputContext(num_replicas_in_sync=2)
    with service.started(service.parse("local:2"), timeout_seconds=30) as services:
        swapped = services.distribute(lambda count, index: make(context, streams=count, stream=count - 1 - index),
                                      first_position_of=lambda batch_index: batch_index * 32)
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            next(iter(swapped))
    error = service.explained(raised.value)
    assert isinstance(error, InputServiceError) and error.exit_code == 1
    assert "first position" in str(error) and "due" in str(error) and "rerun the same command" in str(error), error
    assert service.explained(tf.errors.InvalidArgumentError(None, None, "another failure")) is None


def test_local_services_are_refused_where_other_hosts_run_the_input():
    """A TPU pod slice's hosts run its input pipelines (mocked: no TPU here; tpu_utils.strategy.input_hosts reads
    the TPUStrategy's host count): they cannot reach this host's loopback, so 'local' is a ConfigError, before any
    service starts; grpc:// services are fine there."""
    import tensorflow as tf

    from common.errors import ConfigError
    from data import service
    from tpu_utils.strategy import input_hosts

    with pytest.raises(ConfigError, match=r"DATA_SERVICE='local:2' .* other 3 host\(s\) .*grpc://HOST:PORT"):
        with service.started(service.parse("local:2"), timeout_seconds=1, input_hosts=4):
            pass
    assert input_hosts(tf.distribute.get_strategy()) == 1


def test_a_service_that_does_not_answer_at_start_is_named(tmp_path, data_dir):
    port = free_loopback_ports(1)[0]
    started = time.monotonic()
    result = run_train_py(f"--model_dir={tmp_path / 'run'}", f"--gin_param=DATA_DIR={data_dir!r}",
                          f"--gin_param=DATA_SERVICE='grpc://127.0.0.1:{port}'",
                          "--gin_param=experiment.storage_timeout_seconds=3")
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"no tf.data service answers at 127.0.0.1:{port}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and time.monotonic() - started < 60
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_stop_request_ends_the_wait_for_a_service():
    """SIGINT/SIGTERM while the run waits for an absent service: the first one ends the wait (train.py's check
    raises TrainingInterrupted, exit 3), not the timeout."""
    from common.errors import TrainingInterrupted
    from data import service

    calls = []

    def check_stop():
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise TrainingInterrupted("stopped")

    started = time.monotonic()
    with pytest.raises(TrainingInterrupted):
        service.wait_until_reachable([f"127.0.0.1:{free_loopback_ports(1)[0]}"], timeout_seconds=60,
                                     check_stop=check_stop)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("flags, message", [(["--port=70000"], "'70000' is not a port from 1 to 65535"),
                                            (["--port=PORT_TAKEN"], "is taken"),
                                            (["--port=5050", "--worker_port=PORT_TAKEN"],
                                             "stop it or pick another --worker_port"),
                                            (["--port=5050", "--worker_port=5050"], "needs a port of its own"),
                                            (["--port=5050", "--host="], "--host is empty")])
def test_the_service_command_refuses_a_bad_port_or_host(flags, message):
    """Exit 2 and the reason, before TensorFlow loads. A taken port: gRPC would share it (SO_REUSEPORT) and the runs
    would then reach the wrong service."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        flags = [flag.replace("PORT_TAKEN", str(taken.getsockname()[1])) for flag in flags]
        result = subprocess.run([sys.executable, "-m", "data.service", *flags], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_port_below_1024_is_refused_as_needing_root(monkeypatch, capsys):
    """As a user other than root (this suite runs as root, which may bind them: the OS's refusal is stood in for)."""
    import socket

    from data import service

    def refuse(self, address):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(socket.socket, "bind", refuse)
    with pytest.raises(SystemExit) as ended:
        service.main(["--port=80"])
    assert ended.value.code == 2
    assert "port 80 is below 1024, which only root may listen on: pick another --port" in capsys.readouterr().err


def test_the_worker_listens_on_the_port_it_is_given():
    """--worker_port (what the TPU launcher's firewall note relies on: runs reach the dispatcher and the worker)."""
    from data import service

    dispatcher_port, worker_port = free_loopback_ports(2)
    dispatcher, worker, address = service.start_service(dispatcher_port, worker_port=worker_port)
    try:
        assert address == f"127.0.0.1:{dispatcher_port}"
        assert service.reachable(f"127.0.0.1:{worker_port}")
    finally:
        worker.stop()
        dispatcher.stop()
    assert not service.reachable(f"127.0.0.1:{worker_port}")


# Trained as configs/default.gin ships it (learning rate 0.05 with warm-up and cosine decay, 1,000 steps).
STEPS = ("--gin_param=TRAIN_STEPS=1000", "--gin_param=EVAL_EVERY=0")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """The default config's weights after 1,000 steps without the service."""
    model_dir = tmp_path_factory.mktemp("reference")
    result = run_train_py(f"--model_dir={model_dir}", f"--gin_param=DATA_DIR={data_dir!r}", *STEPS)
    assert result.returncode == 0, result.stderr[-3000:]
    return checkpoint_values(str(model_dir))


def assert_same_weights(model_dir, reference):
    values = checkpoint_values(str(model_dir))
    assert values.keys() == reference.keys()
    differing = [key for key in values if not np.array_equal(values[key], reference[key])]
    assert not differing, f"differ from the run without the service: {differing}"


@pytest.mark.slow
def test_two_local_services_train_the_same_weights(tmp_path, data_dir, reference):
    """'local:2' to the config's stated accuracy with the very weights of the run without the service (bit for
    bit: the same batches in the same order). Resumed runs: the test below (through grpc:// services, killed)."""
    result = run_train_py(f"--model_dir={tmp_path / 'two'}", f"--gin_param=DATA_DIR={data_dir!r}", *STEPS,
                          "--gin_param=DATA_SERVICE='local:2'")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Input from 2 tf.data service(s)" in result.stdout
    final = eval(result.stdout.split("final: ")[1])  # noqa: S307 - train.py's own final line.
    assert final["eval"]["accuracy"] > 0.97, final  # configs/default.gin states 98.9%.
    assert_same_weights(tmp_path / "two", reference)


def start_service(port: int) -> subprocess.Popen:
    """`python -m data.service --port=PORT` as its own process, once it says it serves."""
    process = forked_python.popen(["-m", "data.service", f"--port={port}", "--host=127.0.0.1"],
                                  cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()
    assert line.startswith(f"tf.data service at grpc://127.0.0.1:{port}"), line
    return process


def start_training(model_dir, data_dir, port: int, timeout_seconds: int) -> subprocess.Popen:
    return forked_python.popen(["train.py", f"--model_dir={model_dir}",
                                f"--gin_param=DATA_DIR={data_dir!r}", *STEPS, "--gin_param=CHECKPOINT_EVERY=100",
                                f"--gin_param=DATA_SERVICE='grpc://127.0.0.1:{port}'",
                                f"--gin_param=experiment.storage_timeout_seconds={timeout_seconds}"],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_after_a_checkpoint(training: subprocess.Popen, service: subprocess.Popen, *, restart_port: int = 0):
    """Kills `service` once `training` has logged step 300 or later (a checkpoint every 100 steps; the run, a few
    batches ahead at most, then waits for the service); with `restart_port`, starts a new service there at once.
    Returns (training's exit code, stdout, stderr, the new service)."""
    try:
        lines = []
        for line in training.stdout:
            lines.append(line)
            if re.search(r"step +[3-9]00/1000", line):
                break
        service.send_signal(signal.SIGKILL)
        service.wait()
        restarted = start_service(restart_port) if restart_port else None
        stdout, stderr = training.communicate(timeout=180)
    finally:  # A failed step of the test leaves no training process behind.
        if training.poll() is None:
            training.kill()
            training.wait()
    return training.returncode, "".join(lines) + stdout, stderr, restarted


@pytest.mark.slow
# Over 60 s (60-120 s on 2 cores): four service processes and two training processes (a kill needs a process), the
# watchdog's real timeout, and the resumed run to the shipped 1,000 steps, where exact resume is worth checking.
def test_a_service_killed_or_restarted_mid_run_stops_it_and_the_rerun_resumes_exactly(tmp_path, data_dir,
                                                                                       reference):
    """Restarted at once on its port (it forgets the run's job): exit 1, one line. Killed for good: the watchdog
    ends the run (exit 1, naming the service) after experiment.storage_timeout_seconds, where TensorFlow's client
    would wait for ever. Then the service back and the same command: it resumes from the last checkpoint and ends
    with the weights of the run that never had a failure."""
    port = free_loopback_ports(1)[0]
    model_dir = tmp_path / "run"
    service = start_service(port)
    try:
        code, stdout, stderr, service = kill_after_a_checkpoint(start_training(model_dir, data_dir, port, 60),
                                                                service, restart_port=port)
        assert code == 1, stderr[-3000:]
        assert f"error: a tf.data service of DATA_SERVICE (127.0.0.1:{port}) failed during training" in stderr, \
            stderr[-3000:]
        assert "Traceback" not in stderr and "rerun the same command" in stderr, stderr[-3000:]

        started = time.monotonic()
        code, stdout, stderr, _ = kill_after_a_checkpoint(start_training(model_dir, data_dir, port, 5), service)
        assert code == 1, stderr[-3000:]
        assert f"error: the tf.data service at 127.0.0.1:{port} has not answered for 5 s" in stderr, stderr[-3000:]
        assert time.monotonic() - started < 120
        assert "Resumed from" in stdout, stdout[-2000:]

        service = start_service(port)
        result = run_train_py(f"--model_dir={model_dir}", f"--gin_param=DATA_DIR={data_dir!r}", *STEPS,
                              "--gin_param=CHECKPOINT_EVERY=100", f"--gin_param=DATA_SERVICE='grpc://127.0.0.1:{port}'")
        assert result.returncode == 0, result.stderr[-3000:]
    finally:
        service.kill()
        service.wait()
    assert_same_weights(model_dir, reference)
