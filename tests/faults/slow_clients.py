"""Clients that stop reading: a raw gRPC Connect call and a raw-socket WebSocket.

Each sends responses whose events are large (``generate: false`` with long instructions: the
response object, echoed in ``response.created`` and ``response.completed``, carries them) and
then reads nothing, so the server's socket and HTTP/2 buffers fill and its writes wait.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import struct
from typing import Any

import grpc
import orjson
from bidi_responses.codec import params_to_pb
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

BIG = 1024 * 1024
# Ordinary text (about 4 characters per token), quick to tokenize.
_BLOCK = "def handle(request):\n    return router.dispatch(request)  # %d\n"


def big_creates(lanes: int, chars: int = BIG) -> list[dict[str, Any]]:
    """Warm-up creates whose two events carry ``chars`` of instructions each."""
    text = "".join(_BLOCK % i for i in range(chars // len(_BLOCK)))
    return [
        {
            "type": "response.create",
            "stream_id": f"lane-{n}",
            "model": "sim-model",
            "instructions": f"{n} {text}",
            "input": "hi",
            "generate": False,
            "store": False,
        }
        for n in range(lanes)
    ]


class StalledGrpc:
    """A Connect call that sends and never reads (until ``outcome``)."""

    def __init__(self, port: int) -> None:
        # No BDP probing: the client's HTTP/2 window stays small, as a stalled reader's would.
        self.channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", -1)],
        )
        self.call: Any = pb_grpc.ResponsesServiceStub(self.channel).Connect()  # type: ignore[no-untyped-call]

    async def send(self, events: list[dict[str, Any]]) -> None:
        """Send the events; stops quietly if the server has already ended the call."""
        for event in events:
            body = {k: v for k, v in event.items() if k not in ("type", "stream_id")}
            try:
                await self.call.write(
                    pb.ConnectRequest(
                        stream_id=event["stream_id"], response_create=params_to_pb(body)
                    )
                )
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                return

    async def outcome(self) -> tuple[grpc.StatusCode, str]:
        """Read everything; the status the call ended with."""
        try:
            async for _ in self.call:
                pass
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
        return grpc.StatusCode.OK, ""

    async def close(self) -> None:
        await self.channel.close()


def _client_frame(opcode: int, payload: bytes) -> bytes:
    mask = os.urandom(4)
    header = bytes([0x80 | opcode])
    if len(payload) < 126:
        header += bytes([0x80 | len(payload)])
    elif len(payload) < 1 << 16:
        header += bytes([0x80 | 126]) + struct.pack("!H", len(payload))
    else:
        header += bytes([0x80 | 127]) + struct.pack("!Q", len(payload))
    size = len(payload)
    key = (mask * (size // 4 + 1))[:size]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(size, "big")
    return header + mask + masked


class StalledWebSocket:
    """A raw WebSocket-mode client with a small receive buffer that never reads frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, path: str = "/v1/responses") -> StalledWebSocket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        status = await reader.readuntil(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 101"), status
        return cls(reader, writer)

    async def send(self, events: list[dict[str, Any]]) -> None:
        """Send the events; stops quietly if the server has already dropped the connection."""
        for event in events:
            try:
                self.writer.write(_client_frame(0x1, orjson.dumps(event)))
                await self.writer.drain()
            except ConnectionError:
                return

    async def outcome(self) -> tuple[int, str]:
        """Read every frame to the close frame: its code and reason (1006 if none)."""
        while True:
            try:
                head = await self.reader.readexactly(2)
            except asyncio.IncompleteReadError:
                return 1006, ""
            opcode = head[0] & 0x0F
            length = head[1] & 0x7F
            if length == 126:
                length = struct.unpack("!H", await self.reader.readexactly(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", await self.reader.readexactly(8))[0]
            payload = await self.reader.readexactly(length)
            if opcode == 0x8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                return code, payload[2:].decode()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()
