"""Free TCP ports on 127.0.0.1, for the local multi-worker launcher (scripts/local_cluster.py) and the tests' servers
(the GCS server on loopback, the fake TPU worker): only loopback addresses are ever used."""

import socket


def free_loopback_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (all held open until every one is picked)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
