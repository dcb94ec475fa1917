"""The tf.data service: training batches made by other processes or machines, read back in the exact order.

A host whose CPUs cannot keep up with its accelerators (ImageNet's JPEG decoding on a TPU VM with few cores per
chip) can move the input pipeline to other machines. DATA_SERVICE (experiment.data_service) says where:
- '' (the default): off; the run's own tf.data pipeline (data/pipeline.py).
- 'local' or 'local:N': the run starts N services in its own process, on 127.0.0.1 (tests; hosts with spare cores).
- 'grpc://HOST:PORT' or several, comma-separated: services started with `python -m data.service --port=PORT` on
  other machines (or this one), which read DATA_DIR themselves: give them a gs:// DATA_DIR or the same local path.
Each service is one tf.data dispatcher with one worker. With N services, per-replica batch b of an input pipeline
is made by service b mod N and the run reads them back round-robin: the same batches in the same order as without
the service, for any N, and a resumed run's pipelines start at the resumed step (exact resume). Why not one
dispatcher with N workers: every sharding policy of the tf.data service then delivers batches in the order the
workers finish them, and with static sharding a dead worker's batches are silently skipped (measured: the client
read on from the other worker, half the data gone).

Failures: a service that does not answer at start is waited for up to experiment.storage_timeout_seconds (a line
every 10 s), then InputServiceError (exit 1) names it. During training, TensorFlow's client waits for a dead
service forever inside the training step, which nothing can interrupt; so a watchdog thread checks every service's
port and ends the process (exit 1, naming the service) once one has been down for that timeout. The checkpoints are
intact and a rerun resumes exactly. A restarted service would begin its batches again from the job's first step: the
run checks every batch's first position against the one due and stops with InputServiceError on a mismatch.
"""

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
import time

from common.errors import ConfigError, InputServiceError, shorten
from common.settings import how_to_set
from common.storage_wait import reporting

log = logging.getLogger(__name__)

MAX_LOCAL_SERVICES = 64
CHECK_EVERY_SECONDS = 5.0  # The watchdog's look at every service's port.
# Batches the run requests ahead from each service, and keeps ready after the order check: enough to hide a
# network's latency, bounded so that a run whose services are gone stops within a few batches (an ImageNet batch
# of 256 takes 38 MB; autotuned buffers would hold hundreds of small ones).
BATCHES_AHEAD = 8
# Marks the error of a batch out of sequence, so the Trainer can tell it from any other failed assertion.
OUT_OF_SEQUENCE = "tf.data service batch out of sequence"


@dataclasses.dataclass(frozen=True)
class ServiceSetting:
    """DATA_SERVICE parsed: `local` services to start in this process, or the `addresses` (HOST:PORT) of others."""

    local: int = 0
    addresses: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.local or self.addresses)


def parse(value) -> ServiceSetting:
    """DATA_SERVICE as a ServiceSetting; a ConfigError naming the value and the fix when it is not one."""
    example = how_to_set("data_service", "local:2")
    if value in ("", None):
        return ServiceSetting()
    if not isinstance(value, str):
        raise ConfigError(f"DATA_SERVICE={value!r} must be a string: '', 'local', 'local:N' or "
                          f"'grpc://HOST:PORT[,grpc://HOST:PORT...]'; e.g. {example}.")
    if value == "local" or value.startswith("local:"):
        count = value.partition(":")[2] or "1"
        if not count.isdigit() or not 1 <= int(count) <= MAX_LOCAL_SERVICES:
            raise ConfigError(f"DATA_SERVICE={value!r}: N in 'local:N' must be an integer from 1 to "
                              f"{MAX_LOCAL_SERVICES} (the services this run starts); e.g. {example}.")
        return ServiceSetting(local=int(count))
    addresses = []
    for item in value.split(","):
        host, _, port = item.strip().removeprefix("grpc://").rpartition(":")
        if not item.strip().startswith("grpc://") or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"DATA_SERVICE={value!r}: {item!r} is not grpc://HOST:PORT with a port from 1 to 65535 "
                              "(a service started with `python -m data.service --port=PORT`); use 'local', "
                              "'local:N' or e.g. "
                              "--gin_param=\"DATA_SERVICE='grpc://10.0.0.5:5050'\".")
        addresses.append(f"{host}:{int(port)}")
    if len(set(addresses)) < len(addresses):
        raise ConfigError(f"DATA_SERVICE={value!r} names a service twice; name each service once, e.g. "
                          "--gin_param=\"DATA_SERVICE='grpc://10.0.0.5:5050,grpc://10.0.0.6:5050'\".")
    return ServiceSetting(addresses=tuple(addresses))


def check_settings(config) -> None:
    parse(config.data_service)


def start_service(port: int = 0, *, host: str = "127.0.0.1", worker_port: int = 0) -> tuple:
    """A tf.data dispatcher on `port` and its one worker on `worker_port` (0: any free one), in this process; returns
    (dispatcher, worker, "HOST:PORT" of the dispatcher). The worker announces itself as HOST:its port: runs connect
    to both ports."""
    import tensorflow as tf

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=port))
    dispatcher_port = dispatcher.target.rpartition(":")[2]
    worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=f"127.0.0.1:{dispatcher_port}",
                                                       port=worker_port, worker_address=f"{host}:%port%"))
    return dispatcher, worker, f"{host}:{dispatcher_port}"


class InputServices:
    """The services of one run: `addresses` (HOST:PORT) in the order batches are dealt to them; `distribute` moves an
    input pipeline onto them. Use as a context manager (`started`): local services stop, the watchdog ends."""

    def __init__(self, setting: ServiceSetting, *, timeout_seconds: float, check_stop=None):
        self.timeout_seconds = timeout_seconds
        self._servers = [start_service() for _ in range(setting.local)]
        self.local = bool(setting.local)
        self.addresses = tuple(address for _, _, address in self._servers) or setting.addresses
        self._stopped = threading.Event()
        self._watchdog = None
        if not self.local:
            wait_until_reachable(self.addresses, timeout_seconds=timeout_seconds, check_stop=check_stop)
            self._watchdog = threading.Thread(target=self._watch, name="data-service-watchdog", daemon=True)
            self._watchdog.start()
        log.info("Input from %d tf.data service(s) at %s%s: the same batches in the same order as without them "
                 "(docs/data.md, \"The tf.data service\").", len(self.addresses), ", ".join(self.addresses),
                 " (started in this process)" if self.local else "")

    def distribute(self, make_stream, *, first_position_of):
        """The pipeline `make_stream(num_streams, stream)` (stream k: per-replica batches k, k + N, ... of this input
        pipeline, each (features, targets, positions)) made by the services and dealt back in order; every batch's
        first position is checked against `first_position_of(b)` (int64 tensor) for batch b."""
        import tensorflow as tf

        count = len(self.addresses)
        streams = [make_stream(count, index).apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.OFF, service=f"grpc://{address}",
            max_outstanding_requests=BATCHES_AHEAD, compression=None))
            for index, address in enumerate(self.addresses)]
        merged = streams[0] if count == 1 else tf.data.Dataset.choose_from_datasets(
            streams, tf.data.Dataset.range(count).repeat())
        addresses = tf.constant(self.addresses)

        def in_sequence(batch_index, batch):
            due = first_position_of(batch_index)
            check = tf.debugging.Assert(tf.equal(batch[2][0], due), [
                OUT_OF_SEQUENCE, "from", addresses[batch_index % count], "first position", batch[2][0], "due", due,
                "(a restarted service begins its batches again: rerun the command to resume from the last "
                "checkpoint)"], summarize=3)
            with tf.control_dependencies([check]):
                return tf.nest.map_structure(tf.identity, batch)

        return merged.enumerate().map(in_sequence).prefetch(BATCHES_AHEAD)

    def _watch(self) -> None:
        down_since = {}
        while not self._stopped.wait(CHECK_EVERY_SECONDS):
            for address in self.addresses:
                if reachable(address):
                    down_since.pop(address, None)
                    continue
                since = down_since.setdefault(address, time.monotonic())
                log.warning("The tf.data service at %s does not answer (%.0f s so far; the run stops at %d s).",
                            address, time.monotonic() - since, self.timeout_seconds)
                if time.monotonic() - since >= self.timeout_seconds and not self._stopped.is_set():
                    _end_process(f"the tf.data service at {address} has not answered for {self.timeout_seconds} s "
                                 "(experiment.storage_timeout_seconds); training cannot go on without its batches. "
                                 "Any checkpoint saved before is intact: restart the service (python -m "
                                 "data.service --port=PORT) and rerun the same command to resume.")

    def close(self) -> None:
        self._stopped.set()
        for dispatcher, worker, _ in self._servers:
            worker._stop()
            dispatcher._stop()
        self._servers = []


def explained(error: Exception, addresses=()) -> InputServiceError | None:
    """The InputServiceError for a training step's error that came from the services at `addresses`: a batch out of
    sequence (`distribute`'s check) or the client's own failure (a restarted dispatcher forgets the run's job and
    its dataset); None for any other error."""
    text = str(error)
    resume = ("The batches trained so far were the right ones and any checkpoint saved is intact: rerun the same "
              "command to resume from the last one.")
    if OUT_OF_SEQUENCE in text:
        detail = " ".join(text[text.index(OUT_OF_SEQUENCE):].split("\n")[0].split())
        return InputServiceError(f"{shorten(detail, 400)}: a tf.data service sent a batch other than the one due, "
                                 f"which a restarted service does (it begins its batches again). {resume}")
    markers = ("dispatcher", "tf.data service", "register_dataset", "iteration client")
    cause = next((line for line in text.splitlines() if any(marker in line for marker in markers)), None)
    if cause:
        return InputServiceError(f"a tf.data service of DATA_SERVICE ({', '.join(addresses)}) failed during "
                                 f"training ({shorten(cause, 300)}); a restarted service forgets the run's job. "
                                 f"{resume}")
    return None


def _end_process(message: str) -> None:
    """Ends the process with exit 1: the main thread is blocked inside a TensorFlow op that waits for ever."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(InputServiceError.exit_code)


@contextlib.contextmanager
def started(setting: ServiceSetting, *, timeout_seconds: float, input_hosts: int = 1, check_stop=None):
    """InputServices for `setting` while the body runs (None when the setting is off). `input_hosts`: the hosts
    that run input pipelines (a TPU pod slice's); 'local' services on this host's loopback serve only this one.
    `check_stop()`: called while waiting for the services, to end the wait (by raising) when a stop is requested."""
    if not setting:
        yield None
        return
    if setting.local and input_hosts > 1:
        raise ConfigError(f"DATA_SERVICE='local:{setting.local}' starts the services on this host's 127.0.0.1, which "
                          f"the other {input_hosts - 1} host(s) of this TPU pod slice, whose CPUs run the input "
                          "pipelines, cannot reach. Start services with `python -m data.service --port=PORT` on "
                          "machines they reach and set DATA_SERVICE='grpc://HOST:PORT[,...]'.")
    services = InputServices(setting, timeout_seconds=timeout_seconds, check_stop=check_stop)
    try:
        yield services
    finally:
        services.close()


def reachable(address: str, *, timeout: float = 5.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):  # [::1] -> ::1
            return True
    except OSError:
        return False


def wait_until_reachable(addresses, *, timeout_seconds: float, check_stop=None) -> None:
    """Returns once every service accepts a connection; InputServiceError naming those that did not within
    `timeout_seconds` (a progress line every 10 s meanwhile; `check_stop()` every second)."""
    deadline = time.monotonic() + timeout_seconds
    waiting = [address for address in addresses if not reachable(address)]
    if not waiting:
        return
    with reporting(f"the tf.data service at {', '.join(waiting)}", cause="it is not started yet, or unreachable"):
        while waiting and time.monotonic() < deadline:
            if check_stop is not None:
                check_stop()
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            waiting = [address for address in waiting if not reachable(address)]
    if waiting:
        raise InputServiceError(
            f"DATA_SERVICE: no tf.data service answers at {', '.join(waiting)} (waited {timeout_seconds:.0f} s, "
            "experiment.storage_timeout_seconds). Start it there with `python -m data.service --port=PORT` (see "
            "docs/data.md), or check the address and the firewall; nothing was trained.")


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port from 1 to 65535")
    return int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data.service", description=(
        "Serve training input to runs with DATA_SERVICE='grpc://THIS_HOST:PORT': a tf.data dispatcher and one "
        "worker in this process, until it is stopped (docs/data.md, \"The tf.data service\")."))
    parser.add_argument("--port", type=_port, required=True, help="the dispatcher's port, e.g. 5050")
    parser.add_argument("--worker_port", type=_port, default=None, help="the worker's port (default: any free one); "
                        "runs connect to it too, so a firewall must let them reach both ports")
    parser.add_argument("--host", default=None, help="the address the run reaches this machine at (default: its "
                        "host name); the worker announces itself there")
    args = parser.parse_args(argv)
    if args.host is not None and not args.host.strip():
        parser.error("--host is empty; give the address runs reach this machine at, or leave the flag out")
    if args.worker_port == args.port:
        parser.error(f"--worker_port={args.worker_port} is --port's; the worker needs a port of its own")
    for flag, port in (("--port", args.port), ("--worker_port", args.worker_port)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # gRPC would share a taken port (REUSEPORT).
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # A restart's closed connections do not count.
            try:
                probe.bind(("", port or 0))
            except PermissionError:
                parser.error(f"port {port} is below 1024, which only root may listen on: pick another {flag}, e.g. "
                             "5050")
            except OSError as error:
                parser.error(f"port {port} is taken ({error.strerror}): another service or program listens there; "
                             f"stop it or pick another {flag}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does.
    try:
        from common.tf_logging import quiet_tensorflow

        quiet_tensorflow()
        servers = start_service(args.port, host=args.host or socket.gethostname(), worker_port=args.worker_port or 0)
        print(f"tf.data service at grpc://{servers[2]} (dispatcher and one worker); stop it with Ctrl-C.", flush=True)
        while True:  # Not worker.join(): it blocks in C++, where Ctrl-C cannot reach Python.
            time.sleep(3600)
    except KeyboardInterrupt:
        print("tf.data service stopped.", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
