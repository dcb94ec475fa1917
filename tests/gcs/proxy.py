"""A loopback HTTPS proxy that lets TensorFlow's gs:// client talk to fake-gcs-server (run as its own process).

TensorFlow's GCS filesystem has its endpoints compiled in (https://www.googleapis.com/..., https://storage.googleapis
.com/) but honours `https_proxy` and `CURL_CA_BUNDLE`. This proxy accepts CONNECT for those two hosts only,
terminates TLS with a throw-away CA (written to CA_FILE, for CURL_CA_BUNDLE), and forwards the plain HTTP requests
to the fake server. Plain HTTP requests (google-cloud-storage with STORAGE_EMULATOR_HOST pointed here) are forwarded
the same way, so both clients see the same rules:
- drops `Transfer-Encoding: identity` (TF sends it on empty uploads; Go's net/http answers 501);
- rewrites the `Location` of resumable-upload answers to https://www.googleapis.com/... so follow-ups come back here;
- answers `GET /storage/v1/b/<bucket>/storageLayout` (TF asks before renames; the fake server says 404);
- answers 403 to every request that writes to a bucket listed in DENY_FILE (the fake server has no permissions);
- answers 503 when the fake server is down (as GCS would while unreachable).
A separate process, never a thread of the test process: TF does GCS I/O while holding the GIL.

  python tests/gcs/proxy.py UPSTREAM_PORT CA_FILE DENY_FILE PORT_FILE
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
import urllib.parse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

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


class Forwarder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # Keep-alive, as the clients expect.
    upstream_port: int
    tls_context: ssl.SSLContext
    deny_file: str

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
        bucket = re.match(r"(?:/upload)?/storage/v1/b/([^/?]+)", path)
        bucket = bucket and bucket.group(1) or (re.match(r"/([^/?]+)", path) or [None, None])[1]
        if self.command in _WRITES and bucket and bucket in self._denied():
            self._answer(403, {"error": {"code": 403, "message": f"test proxy: no write access to {bucket}"}})
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
            upstream.request(self.command, path, body=body, headers=headers)
            response = upstream.getresponse()
            payload = response.read()
        except OSError as error:
            self._answer(503, {"error": {"code": 503, "message": f"test proxy: GCS server unreachable ({error})"}})
            return
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() in ("transfer-encoding", "connection", "content-length"):
                continue
            if key.lower() == "location":
                parts = urllib.parse.urlsplit(value)
                value = urllib.parse.urlunsplit(("https", GCS_HOSTS[0], parts.path, parts.query, ""))
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

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


def main(upstream_port: str, ca_file: str, deny_file: str, port_file: str) -> None:
    Forwarder.upstream_port, Forwarder.deny_file = int(upstream_port), deny_file
    Forwarder.tls_context = make_tls_context(ca_file)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forwarder)
    server.daemon_threads = True
    with open(port_file + ".tmp", "w") as handle:
        handle.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)  # Readers see the whole port number or nothing.
    server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:])
