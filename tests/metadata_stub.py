"""A loopback stand-in for the GCE metadata server (169.254.169.254 / metadata.google.internal).

Credential and TPU look-ups (google-auth, TF's GCS auth, TPUClusterResolver with a name, tpu_utils/tpu/facts.py)
probe the metadata server. Every test process points GCE_METADATA_HOST/GCE_METADATA_IP here, so no such probe leaves
the machine. As the real server does, it refuses (403) a request without the `Metadata-Flavor: Google` header, and
answers with that header; it answers the paths of VALUES_FILE (JSON: {"/computeMetadata/v1/...": "text"}, e.g. a TPU
VM's accelerator-type) and 404 to everything else (the session's stub has no values: not a GCE VM, no credentials).
Run as its own process: `python tests/metadata_stub.py PORT_FILE [VALUES_FILE]`.
"""

import http.server
import json
import os
import sys


class _Metadata(http.server.BaseHTTPRequestHandler):
    values: dict = {}

    def _answer(self):
        if self.headers.get("Metadata-Flavor") != "Google":
            status, body = 403, b"Missing required header: Metadata-Flavor"
        else:
            value = self.values.get(self.path.split("?", 1)[0])
            status, body = (404, b"") if value is None else (200, value.encode())
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args):
        del args


def main(port_file: str, values_file: str | None = None) -> None:
    if values_file:
        with open(values_file) as handle:
            _Metadata.values = json.load(handle)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    with open(port_file + ".tmp", "w") as handle:
        handle.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)  # Readers see the whole port number or nothing.
    server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:])
