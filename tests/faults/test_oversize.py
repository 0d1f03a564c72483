"""Oversize messages are refused from their declared size, before the payload is buffered:
the client announces a huge message, sends a few bytes of it, and is refused at once."""

from __future__ import annotations

import asyncio
import os
import struct

from bidi_responses.server.app import RunningServer

from tests.faults.slow_clients import StalledWebSocket

GIB = 1 << 30


async def test_a_websocket_frame_announcing_1_gib_is_refused_from_its_header(
    http_server: RunningServer,
) -> None:
    assert http_server.http_port is not None
    async with asyncio.timeout(20):
        client = await StalledWebSocket.open(http_server.http_port)
        try:
            header = bytes([0x81, 0x80 | 127]) + struct.pack("!Q", GIB) + os.urandom(4)
            client.writer.write(header + b"{" * 1024)
            await client.writer.drain()
            code, reason = await client.outcome()
        finally:
            await client.close()
        assert code == 1009, reason


async def test_an_http_body_announcing_1_gib_is_refused_before_it_is_sent(
    http_server: RunningServer,
) -> None:
    async with asyncio.timeout(20):
        reader, writer = await asyncio.open_connection("127.0.0.1", http_server.http_port)
        try:
            writer.write(
                b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {GIB}\r\n\r\n".encode()
                + b'{"model": "sim-model", "input": "'
            )
            await writer.drain()
            status = await reader.readuntil(b"\r\n")
        finally:
            writer.close()
        assert status.startswith(b"HTTP/1.1 413"), status
