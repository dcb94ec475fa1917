"""Datasets that download: what a failed download raises, and a fast answer when this machine is offline.

TFDS retries every failed request 10 times with exponential back-off (about 3.5 minutes), a failed name lookup
included, so on a machine without internet a dataset that downloads (MNIST, CIFAR-10, `tfds:NAME`) used to sit in
retries before the error that says to stage it elsewhere. A name lookup of the host most TFDS datasets download from
answers in milliseconds: when it fails (and no proxy is configured, which would do the lookup instead), a lookup
failure is not transient, so TFDS is let make one attempt per request instead of eleven.
"""

import contextlib
import os
import socket
import threading

import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import downloader

PROBE_HOST = "storage.googleapis.com"  # TFDS's own mirror, where most registered datasets come from.
PROBE_SECONDS = 5.0  # A lookup that takes longer is left to TFDS (its own timeouts apply).
PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


def download_errors() -> tuple[type[BaseException], ...]:
    """What a TFDS download raises when the source cannot be reached: requests' errors (HTTP), urllib's (FTP), a
    failed name lookup or connection, and TFDS's DownloadError (an HTTP status other than 200). Most are OSErrors:
    they must be told apart from a DATA_DIR that cannot be written (builders.load_builder)."""
    import urllib.error

    import requests

    return (requests.exceptions.RequestException, urllib.error.URLError, socket.gaierror, ConnectionError,
            TimeoutError, tfds.download.DownloadError)


def offline_reason(environ=os.environ, host: str = PROBE_HOST) -> str | None:
    """Why a download cannot work from here (the failed lookup of `host`), or None when it may: the lookup worked,
    took longer than PROBE_SECONDS, or a proxy is configured."""
    if any(environ.get(name) for name in PROXY_VARIABLES):
        return None
    outcome = {}

    def look_up():
        try:
            socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
        except OSError as error:  # socket.gaierror, e.g. "[Errno -2] Name or service not known".
            outcome["error"] = error

    lookup = threading.Thread(target=look_up, daemon=True)
    lookup.start()
    lookup.join(PROBE_SECONDS)
    if lookup.is_alive() or "error" not in outcome:
        return None
    return f"{host} cannot be looked up ({outcome['error']})"


@contextlib.contextmanager
def fail_fast_when_offline():
    """Within it, TFDS makes one attempt per download request instead of eleven when offline_reason() finds this
    machine offline; yields that reason (None: online or unknown, and TFDS keeps its retries)."""
    reason = offline_reason()
    if reason is None or not hasattr(downloader, "MAX_RETRIES"):
        yield reason
        return
    saved, downloader.MAX_RETRIES = downloader.MAX_RETRIES, 0
    try:
        yield reason
    finally:
        downloader.MAX_RETRIES = saved

