"""A loopback stand-in for the GCE metadata server (169.254.169.254 / metadata.google.internal).

Credential and TPU look-ups (google-auth, TF's GCS auth, TPUClusterResolver with a name) probe the metadata server.
Every test process points GCE_METADATA_HOST/GCE_METADATA_IP here, so no such probe leaves the machine: it answers
404 to everything at once. Run as its own process: `python tests/metadata_stub.py PORT_FILE`.
"""

import http.server
import sys


class _NotFound(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        self.send_response(404)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args):
        del args


def main(port_file: str) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    with open(port_file, "w") as handle:
        handle.write(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1])
