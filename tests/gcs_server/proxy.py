"""A loopback HTTPS proxy that lets TensorFlow's gs:// client talk to fake-gcs-server (run as its own process).

TensorFlow's GCS filesystem has its endpoints compiled in (https://www.googleapis.com/..., https://storage.googleapis
.com/) but honours `https_proxy` and `CURL_CA_BUNDLE`. This proxy accepts CONNECT for those two hosts only,
terminates TLS with a throw-away CA (written to DIRECTORY/ca.pem, for CURL_CA_BUNDLE), and forwards the plain HTTP
requests to the fake server. Plain HTTP requests (google-cloud-storage with STORAGE_EMULATOR_HOST pointed here) are
forwarded the same way, so both clients see the same rules:
- drops `Transfer-Encoding: identity` (TF sends it on empty uploads; Go's net/http answers 501);
- rewrites the `Location` of resumable-upload answers so follow-ups come back here: https://www.googleapis.com/...
  for TF (tunnelled), http://<this proxy>/... for google-cloud-storage (whose CA bundle does not trust ours);
- answers `GET /storage/v1/b/<bucket>/storageLayout` (TF asks before renames; the fake server says 404);
- answers 403 to every request that writes to a bucket listed in DIRECTORY/deny (the fake server has no permissions);
- answers 412 when a request's ifGenerationMatch/ifMetagenerationMatch does not hold (fake-gcs-server checks them
  on uploads only, GCS on reads and deletes too);
- answers 400 to a request that creates an object whose name has an empty segment ('a//b') or starts with '/'
  (tests/gcs_server/object_names.py): GCS would store it apart from 'a/b', so no code of ours may ever form one; with
  the filesystem BACKEND, which stores 'a//b' as the file 'a/b', every other request naming one gets 404, as on GCS
  (with the memory backend the server keeps names exact: reads and deletes of one go through);
- answers the failures listed in DIRECTORY/faults.jsonl (`GcsEmulator.inject_failures`: a regex, a status, a count)
  instead of forwarding (or after it: an answer lost on the way), and logs each one served to
  DIRECTORY/faults_served.log; holds a request until the test releases it (`GcsEmulator.hold`), and stops enforcing
  preconditions when told to (tests/gcs_server/request_rules.py);
- answers a resumable upload's status query with 308 and what was stored, as GCS does (UploadSessions);
- answers 503 when the fake server is down (as GCS would while unreachable).
A separate process, never a thread of the test process: TF does GCS I/O while holding the GIL.

  python tests/gcs_server/proxy.py UPSTREAM_PORT DIRECTORY BACKEND
"""
import datetime
import http.client
import http.server
import json
import os
import re
import socket
import ssl
import sys
import tempfile
import threading
import urllib.parse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from object_names import named_objects, unsafe_name
from request_rules import Faults, Holds, without_preconditions

GCS_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
_WRITES = ("POST", "PUT", "PATCH", "DELETE")


def make_tls_context(ca_file: str) -> ssl.SSLContext:
    """A server context for GCS_HOSTS with a certificate from a fresh CA; the CA goes to `ca_file`."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "template tests throw-away CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GCS_HOSTS[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host) for host in GCS_HOSTS]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    with open(ca_file, "wb") as handle:
        handle.write(ca.public_bytes(serialization.Encoding.PEM))
    with tempfile.NamedTemporaryFile("wb", suffix=".pem", delete=False) as handle:
        handle.write(leaf.public_bytes(serialization.Encoding.PEM))
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(handle.name)
    os.unlink(handle.name)
    return context


class UploadSessions:
    """What each resumable upload session has stored, to answer its status query as GCS does.

    A client whose data PUT failed asks how much arrived (`PUT` with `Content-Range: bytes */N` and no body). GCS
    answers 308 with the Range stored (none: start again). fake-gcs-server answers 200 and stores an EMPTY object,
    so TensorFlow's retried upload 'completes' with no bytes. Sessions the server has not completed get GCS's
    answer here."""

    def __init__(self):
        self._received: dict[str, int] = {}  # upload_id -> bytes the server acknowledged (308 Range); -1 when done.
        self._lock = threading.Lock()

    @staticmethod
    def _upload_id(path: str) -> str | None:
        return (urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("upload_id") or [None])[0]

    def answer_status_query(self, handler, path: str, body: bytes) -> bool:
        upload_id = self._upload_id(path)
        if handler.command != "PUT" or not upload_id or body or \
                not re.fullmatch(r"bytes \*/(\d+|\*)", handler.headers.get("Content-Range", "")):
            return False
        with self._lock:
            received = self._received.get(upload_id, 0)
        if received < 0:
            return False  # Completed: the server answers with the object.
        handler.send_response(308, "Resume Incomplete")
        if received:
            handler.send_header("Range", f"bytes=0-{received - 1}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return True

    def observe(self, path: str, response) -> None:
        upload_id = self._upload_id(path)
        if not upload_id:
            return
        stored = re.fullmatch(r"bytes=0-(\d+)", response.getheader("Range") or "")
        with self._lock:
            if response.status in (200, 201):
                self._received[upload_id] = -1
            elif response.status == 308 and stored:
                self._received[upload_id] = int(stored.group(1)) + 1


class Forwarder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # Keep-alive, as the clients expect.
    upstream_port: int
    tls_context: ssl.SSLContext
    deny_file: str
    backend: str
    faults: Faults
    holds: Holds
    sessions = UploadSessions()
    _status = None  # The status of the last answer sent.

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # 40 ms per request otherwise.

    def log_message(self, *args):
        del args

    def do_CONNECT(self):
        host = self.path.rsplit(":", 1)[0]
        if host not in GCS_HOSTS:
            self._answer(403, {"error": f"this test proxy only serves {GCS_HOSTS}"})
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        tls = self.tls_context.wrap_socket(self.connection, server_side=True)
        Forwarder(tls, self.client_address, self.server)  # Serves the tunnelled requests until the client closes.
        self.close_connection = True

    def _forward(self):
        body = self._read_body()
        path = urllib.parse.urlsplit(self.path)._replace(scheme="", netloc="").geturl()  # Absolute form from proxies.
        named = named_objects(self.command, path, self.headers.get("Host", ""), body,
                              self.headers.get("Content-Type", ""))
        described = " ".join([self.command, urllib.parse.unquote(path), *named.reads, *named.creates])
        held = self.holds.hold(self.command, described)  # Handled below as the storage is when it is released.
        try:
            self._handle(body, path, named, described)
        finally:
            if held is not None:
                self.holds.answered(held, self._status)

    def send_response(self, code, message=None):
        self._status = code  # For the answer to a held request.
        super().send_response(code, message)

    def _handle(self, body: bytes, path: str, named, described: str):
        bucket = named.bucket
        if self.holds.preconditions_ignored(described):
            path = without_preconditions(path)
        if self.command in _WRITES and bucket and bucket in self._denied():
            self._answer(403, {"error": {"code": 403, "message": f"test proxy: no write access to {bucket}"}})
            return
        if self._refused_name(named) or self._precondition_failed(named, path):
            return
        rule = self.faults.take(self.command, described)
        if rule is not None and not rule.get("forwarded"):
            self._fail(rule)
            return
        headers = {key: value for key, value in self.headers.items()
                   if key.lower() not in ("transfer-encoding", "connection", "proxy-connection", "content-length")}
        if body or self.command in _WRITES:
            headers["Content-Length"] = str(len(body))
        try:
            upstream = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
            if path.endswith("/storageLayout") and self.command == "GET":
                upstream.request("GET", path.rsplit("/storageLayout", 1)[0], headers=headers)
                exists = upstream.getresponse()
                exists.read()
                if exists.status == 200:
                    self._answer(200, {"kind": "storage#storageLayout", "bucket": bucket,
                                       "hierarchicalNamespace": {"enabled": False}})
                else:
                    self._answer(exists.status, {"error": {"code": exists.status, "message": "no such bucket"}})
                return
            if self.sessions.answer_status_query(self, path, body):
                return
            upstream.request(self.command, path, body=body, headers=headers)
            response = upstream.getresponse()
            payload = response.read()
            self.sessions.observe(path, response)
        except OSError as error:
            self._answer(503, {"error": {"code": 503, "message": f"test proxy: GCS server unreachable ({error})"}})
            return
        if rule is not None:  # Done, but the client never hears so: its answer is lost on the way.
            self._fail(rule)
            return
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() in ("transfer-encoding", "connection", "content-length"):
                continue
            if key.lower() == "location":  # Back through here: over TLS for TF, plain for google-cloud-storage.
                parts = urllib.parse.urlsplit(value)
                tunnelled = isinstance(self.connection, ssl.SSLSocket)
                value = urllib.parse.urlunsplit(("https" if tunnelled else "http",
                                                 GCS_HOSTS[0] if tunnelled else self.headers.get("Host", ""),
                                                 parts.path, parts.query, ""))
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

    def _fail(self, rule: dict) -> None:
        self._answer(rule["status"], {"error": {"code": rule["status"], "message": f"test proxy: injected failure "
                                                f"{rule['status']} ({rule['pattern']})"}})

    def _refused_name(self, named) -> bool:
        """Answers (and returns True) a request naming an object GCS would keep apart from what the code meant."""
        created = [name for name in named.creates if unsafe_name(name)]
        if created:
            self._answer(400, {"error": {"code": 400, "message": f"test proxy: refusing to create {created[0]!r}: an "
                                         "empty path segment or a leading '/' (GCS would keep it apart from the "
                                         "name with single slashes)"}})
            return True
        read = [name for name in named.reads if unsafe_name(name)]
        if read and self.backend == "filesystem":  # That backend would answer for the file of 'a/b'.
            self._answer(404, {"error": {"code": 404, "message": f"No such object: {named.bucket}/{read[0]}"}})
            return True
        return False

    def _precondition_failed(self, named, path: str) -> bool:
        """Answers 412 (and returns True) when ifGenerationMatch/ifMetagenerationMatch does not hold for the one
        object the request names: fake-gcs-server checks them on uploads only, GCS on every request."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        wanted = {key: query[field][0] for key, field in (("generation", "ifGenerationMatch"),
                                                         ("metageneration", "ifMetagenerationMatch"))
                  if field in query}
        objects = named.reads + named.creates
        if not wanted or len(objects) != 1 or not named.bucket:
            return False
        upstream = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
        try:
            upstream.request("GET", f"/storage/v1/b/{named.bucket}/o/{urllib.parse.quote(objects[0], safe='')}")
            response = upstream.getresponse()
            current = json.loads(response.read() or b"{}") if response.status == 200 else {}
        except (OSError, ValueError):
            return False  # The forwarded request reports the outage.
        failed = [key for key, value in wanted.items() if str(current.get(key, 0)) != value]
        if failed:
            self._answer(412, {"error": {"code": 412, "message": f"test proxy: precondition failed ({failed[0]} of "
                                         f"{objects[0]!r} is {current.get(failed[0], 0)}, not {wanted[failed[0]]})"}})
        return bool(failed)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if not size:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _denied(self) -> set:
        try:
            with open(self.deny_file) as handle:
                return set(handle.read().split())
        except FileNotFoundError:
            return set()

    def _answer(self, status: int, value: dict):
        payload = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def main(upstream_port: str, directory: str, backend: str) -> None:
    Forwarder.upstream_port, Forwarder.backend = int(upstream_port), backend
    Forwarder.deny_file, Forwarder.faults = os.path.join(directory, "deny"), Faults(directory)
    Forwarder.holds = Holds(directory)
    Forwarder.tls_context = make_tls_context(os.path.join(directory, "ca.pem"))
    port_file = os.path.join(directory, "proxy_port")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forwarder)
    server.daemon_threads = True
    with open(port_file + ".tmp", "w") as handle:
        handle.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)  # Readers see the whole port number or nothing.
    server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:])
