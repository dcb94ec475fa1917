"""PROFILE_STEPS=(start, stop): a TensorFlow profiler trace of that step range, written to model_dir (chief only).

The host acts between on-device loops only, so the trace covers whole loops: it starts before the first loop that
runs a step in [start, stop) and stops after the loop that reaches `stop`. The trace lands in
model_dir/plugins/profile/<timestamp>/<host>.xplane.pb, where TensorBoard's profile plugin
(`tensorboard-plugin-profile`) finds it: `tensorboard --logdir runs`, then the Profile tab. On TPUs, the chief can
also serve on-demand captures (`tf.profiler.experimental.server.start(port)`; docs/watch_a_run.md).
"""

import errno
import logging
import socket

import tensorflow as tf

from common.errors import ConfigError

log = logging.getLogger(__name__)


def start_server(port: int) -> None:
    """PROFILER_PORT: serves on-demand captures for the whole run (TensorBoard's "Capture profile", or
    `tf.profiler.experimental.client.trace('grpc://HOST:PORT', LOGDIR, duration_ms)`); 0 = off."""
    if port:
        check_port_free(port)
        tf.profiler.experimental.server.start(port)
        log.info("Profiler server on port %d: capture with TensorBoard's Profile tab (\"Capture profile\", "
                 "localhost:%d) or tf.profiler.experimental.client.trace.", port, port)


def check_port_free(port: int) -> None:
    """A ConfigError if this host cannot serve on `port`: TensorFlow's profiler server binds [::]:PORT (else
    0.0.0.0:PORT) and, when that fails, only logs it and serves nothing, so a taken port would leave a run that
    announces a server no one can reach. Binds the same addresses here first (SO_REUSEADDR, as gRPC does, so only
    a listening socket counts as taken) and lets go. 0 = off: nothing to check."""
    if not port:
        return
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # [::] covers IPv4 too, as gRPC's does.
        address = ("::", port)
    except OSError:  # No IPv6 on this host: gRPC falls back to 0.0.0.0.
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = ("0.0.0.0", port)
    with probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            reason = "is taken by another process" if error.errno == errno.EADDRINUSE else \
                f"cannot be bound ({error.strerror})"
            raise ConfigError(f"PROFILER_PORT={port} {reason} on this host, so the profiler server could not serve "
                              f"on it; pick another, e.g. --gin_param=\"PROFILER_PORT={6009 if port != 6009 else 6010}"
                              "\", or 0 for no server.") from None


class Profiler:
    """Starts and stops the trace around the loops of PROFILE_STEPS."""

    def __init__(self, steps: tuple[int, int] | None, logdir: str, *, enabled: bool = True, may_write=None):
        """`may_write()`: whether the run may still write logdir (its lock held, its storage answering); a trace
        that may not be written is discarded."""
        self.steps = steps if enabled else None
        self.logdir = logdir
        self.may_write = may_write or (lambda: True)
        self.active = False
        self.done = False

    def before_loop(self, step: int, num_steps: int) -> None:
        if self.steps is None or self.active or self.done:
            return
        start, stop = self.steps
        if step < stop and step + num_steps > start:
            try:
                tf.profiler.experimental.start(self.logdir)
            except (tf.errors.OpError, RuntimeError) as error:
                log.warning("Profiler not started (%s); training goes on without a trace.", error)
                self.done = True
                return
            self.active = True
            log.info("Profiling steps %d-%d (whole loops from step %d) into %s/plugins/profile.", start, stop, step,
                     self.logdir)

    def after_loop(self, step: int) -> None:
        if self.active and step >= self.steps[1]:
            self.stop()

    def stop(self) -> None:
        """Stops and writes the trace (also when training ends inside the range)."""
        if not self.active:
            return
        self.active, self.done = False, True
        if not self.may_write():
            tf.profiler.experimental.stop(save=False)
            return
        try:
            tf.profiler.experimental.stop()
            log.info("Profiler trace written to %s/plugins/profile (TensorBoard: Profile tab).", self.logdir)
        except (tf.errors.OpError, RuntimeError) as error:
            log.warning("Profiler trace not written (%s).", error)
