"""Loopback ports for the servers the benchmarks, cluster tools and tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
