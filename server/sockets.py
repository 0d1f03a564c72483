"""Bound TCP sockets made the one way both the HTTP listener and the worker supervisor need."""

from __future__ import annotations

import socket


def bound_socket(host: str, port: int, *, reuse_addr: bool, reuse_port: bool) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port), closed again if binding fails.

    ``reuse_port`` (``SO_REUSEPORT``) lets every worker process bind its own socket to the
    same port, the kernel spreading new connections over them.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        if reuse_addr:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock
