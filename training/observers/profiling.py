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
from common.settings import MAX_STEPS, require_int

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


MAX_PORT = 65535


def check_settings(config) -> dict:
    """PROFILE_STEPS (start, stop) and PROFILER_PORT."""
    require_int("profiler_port", config.profiler_port, minimum=0, example=0, maximum=MAX_PORT,
                why="the largest TCP port; 0 = off", limit_example=6009)
    return {"profile_steps": check_profile_steps(config.profile_steps)}


def check_profile_steps(profile_steps) -> tuple[int, int] | None:
    """PROFILE_STEPS as (start, stop) with 0 <= start < stop, or None; a ConfigError otherwise."""
    if profile_steps is None:
        return None
    if not isinstance(profile_steps, (tuple, list)) or len(profile_steps) != 2 or \
            not all(isinstance(value, int) and not isinstance(value, bool) for value in profile_steps) or \
            not 0 <= profile_steps[0] < profile_steps[1] <= MAX_STEPS:
        raise ConfigError(f"PROFILE_STEPS={profile_steps!r} must be (start, stop) with 0 <= start < stop <= "
                          f"{MAX_STEPS} (2**31 - 1), e.g. --gin_param=\"PROFILE_STEPS=(200, 300)\", or None.")
    return tuple(profile_steps)
