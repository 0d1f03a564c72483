"""Bytes on the wire, read from the kernel: the same yardstick for every transport.

Counting at the application layer would need a different (and partly guessed) framing model
per protocol: HTTP/2 frame and HPACK headers for gRPC, chunked encoding and headers for HTTP,
frame headers for WebSocket. Instead each client process asks the kernel for the TCP payload
bytes of its own sockets to the server (``TCP_INFO``: ``tcpi_bytes_sent`` and
``tcpi_bytes_received``), which include every byte of framing and nothing else. It works for
sockets owned by C libraries (grpc) too, because it only needs a file descriptor: we dup the
process's socket descriptors, query them and close the duplicates.

Linux only (the kernel must be 4.19 or newer for ``tcpi_bytes_sent``); elsewhere the counters
read as zero and the report says bytes were not measured.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["SocketBytes", "WireCounter"]

# Offsets in struct tcp_info (include/uapi/linux/tcp.h): tcpi_bytes_received is a u64 at 128,
# tcpi_bytes_sent a u64 at 200 (4.19+). bytes_acked (at 120) would count the SYN as one byte.
_RECEIVED_AT = 128
_SENT_AT = 200
_INFO_LEN = 232


@dataclass(frozen=True, slots=True)
class SocketBytes:
    """Payload bytes sent and received on the sockets to the server, per socket inode."""

    sent: dict[str, int]
    received: dict[str, int]


class WireCounter:
    """Reads the TCP byte counters of this process's connections to ``ports`` on ``host``."""

    def __init__(self, host: str, ports: Iterable[int]) -> None:
        self._host = host
        self._ports = frozenset(ports)
        self.available = sys.platform.startswith("linux") and hasattr(socket, "TCP_INFO")

    def snapshot(self) -> SocketBytes:
        """Counters of every open socket to the server (empty when unavailable)."""
        sent: dict[str, int] = {}
        received: dict[str, int] = {}
        if not self.available:
            return SocketBytes(sent, received)
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            return SocketBytes(sent, received)
        for name in names:
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if not target.startswith("socket:"):
                continue
            counters = self._read(int(name))
            if counters is not None:
                sent[target], received[target] = counters
        return SocketBytes(sent, received)

    def _read(self, fd: int) -> tuple[int, int] | None:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            return None
        with contextlib.closing(sock):
            try:
                if sock.type != socket.SOCK_STREAM or sock.family not in (
                    socket.AF_INET,
                    socket.AF_INET6,
                ):
                    return None
                peer = sock.getpeername()
                if peer[1] not in self._ports:
                    return None
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_LEN)
            except OSError:
                return None
        if len(info) < _SENT_AT + 8:
            return None
        (received,) = struct.unpack_from("Q", info, _RECEIVED_AT)
        (sent,) = struct.unpack_from("Q", info, _SENT_AT)
        return sent, received

    @staticmethod
    def delta(before: SocketBytes, after: SocketBytes) -> tuple[int, int]:
        """Bytes (sent, received) between two snapshots.

        Sockets opened in between count from zero; sockets closed in between are lost, so take
        the second snapshot before a per-turn connection is closed.
        """
        sent = sum(v - before.sent.get(k, 0) for k, v in after.sent.items())
        received = sum(v - before.received.get(k, 0) for k, v in after.received.items())
        return sent, received
