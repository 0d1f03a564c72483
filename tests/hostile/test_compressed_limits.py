"""Limits count what the server holds, not what crossed the wire: a message that compresses a
thousandfold is held to the message limit and the server-wide budget at its inflated size,
on every compressed path (WebSocket permessage-deflate, gRPC message compression, HTTP
``Content-Encoding``)."""

from __future__ import annotations

import asyncio
import gc
import gzip
import logging
import types
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
import websockets
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.client.types import JSONValue
from bidi_responses.server.app import RunningServer
from bidi_responses.server.transports.http.uvicorn_ws import WebSocketProtocol
from bidi_responses.v1 import responses_pb2 as pb
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory

from tests.conftest import ServerFactory, make_config, until
from tests.hostile.test_grpc_decode import CONNECT, _create_bytes
from tests.ws.conftest import connector, final

SMALL: dict[str, JSONValue] = {"model": "sim-model", "input": "hi", "store": False}


async def test_websocket_compression_is_off_by_default_even_when_offered(
    http_server: RunningServer,
) -> None:
    """The websockets library offers permessage-deflate by default (the openai SDK does not);
    the server declines it, and the client's frames then arrive as they are counted."""
    assert http_server.http_port is not None
    async with asyncio.timeout(30), connector(http_server.http_port)() as sock:
        offered = sock.ws.request
        assert offered is not None
        assert "permessage-deflate" in offered.headers.get("Sec-WebSocket-Extensions", "")
        assert sock.ws.protocol.extensions == []
        assert final(await sock.create(**SMALL))["status"] == "completed"


async def test_compressed_websocket_messages_are_charged_as_they_inflate(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """With compression on, 16 connections each send the first fragment of a message that is
    ~4 KB on the wire and 3 MB inflated, against a 16 MB budget (4 copies a byte: 12 MB
    each), and hold back its last fragment: one is charged, the 15 others are closed with 1013
    saying it is the budget while they inflate, the budget is never passed, and a connection
    that sends a small compressed message is served meanwhile and after."""
    config = make_config(tmp_path)
    config.limits.websocket_compression = True
    config.limits.max_inflight_request_bytes = 16_000_000
    running: RunningServer = await server_factory(config, http=True)
    assert running.http_port is not None
    budget = running.core.request_bytes
    connect = connector(running.http_port)
    wire = orjson.dumps({"type": "response.create", **SMALL, "instructions": "y" * 3_000_000})
    head, tail = wire[:-8].decode(), wire[-8:].decode()
    all_charged = asyncio.Event()
    outcomes: list[str] = []

    async def fragments() -> AsyncIterator[str]:
        yield head
        await all_charged.wait()
        yield tail

    async def send_big() -> None:
        async with connect(compression="deflate") as sock:
            assert sock.ws.protocol.extensions, "compression was negotiated"
            try:
                await sock.ws.send(fragments())
                while True:
                    event = await sock.recv()
                    if event["type"] in ("response.completed", "error"):
                        outcomes.append(event["type"])
                        return
            except websockets.ConnectionClosed as closed:
                assert closed.rcvd is not None, closed
                assert closed.rcvd.code == 1013 and "budget" in closed.rcvd.reason
                outcomes.append("1013")

    async with asyncio.timeout(60):
        async with connect(compression="deflate") as small:
            senders = [asyncio.ensure_future(send_big()) for _ in range(16)]
            # Every first fragment has reached the server: charged, or refused.
            await until(lambda: budget.refused == 15 and budget.held >= 12_000_000)
            assert final(await small.create(**SMALL))["status"] == "completed"
            all_charged.set()
            await asyncio.gather(*senders)
            assert final(await small.create(**SMALL))["status"] == "completed"
    assert sorted(outcomes) == ["1013"] * 15 + ["response.completed"]
    assert budget.peak <= budget.limit, (budget.peak, budget.limit)
    async with asyncio.timeout(10):
        await until(lambda: budget.held == 0)


async def test_a_websocket_message_compressed_past_the_message_limit_is_closed_1009(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """The message limit applies to the inflated size: 2 MB of one letter (2 KB on the wire)
    past a 1 MB limit is refused with 1009 (message too big), before it is inflated whole."""
    config = make_config(tmp_path)
    config.limits.websocket_compression = True
    config.limits.max_message_bytes = 1_000_000
    running: RunningServer = await server_factory(config, http=True)
    assert running.http_port is not None
    deflate = ClientPerMessageDeflateFactory()
    async with asyncio.timeout(30):
        async with connector(running.http_port)(extensions=[deflate], compression=None) as sock:
            await sock.send({"type": "response.create", **SMALL, "instructions": "z" * 2_000_000})
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await sock.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        assert running.core.request_bytes.peak < 1_000_000 * 4


async def test_grpc_compressed_message_is_held_to_the_limit_at_its_inflated_size(
    server_factory: ServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """gzip on a gRPC message: 2 MB of one letter is ~2 KB on the wire; past a 1 MB message
    limit grpc core refuses it once inflated (RESOURCE_EXHAUSTED, saying so); within the limit
    but past the budget, the server's budget counts its inflated size (``server_busy``)."""
    config = make_config(tmp_path)
    config.limits.max_message_bytes = 1_000_000
    config.limits.max_inflight_request_bytes = 2_000_000
    running: RunningServer = await server_factory(config)
    too_big = _create_bytes({**SMALL, "instructions": "x" * 2_000_000})
    assert len(gzip.compress(too_big)) < 20_000
    over_budget = _create_bytes({**SMALL, "instructions": "x" * 900_000})
    async with asyncio.timeout(30):
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{running.grpc_port}", compression=grpc.Compression.Gzip
        ) as channel:
            connect: grpc.aio.StreamStreamMultiCallable[bytes, pb.ConnectResponse] = (
                channel.stream_stream(
                    CONNECT,
                    request_serializer=None,
                    response_deserializer=pb.ConnectResponse.FromString,
                )
            )
            call = connect(iter([too_big]))
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async for _ in call:
                    pass
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in (raised.value.details() or "")
        # 900 KB inflated is 2.7 MB at 3 copies a byte: past the 2 MB budget.
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client:
            with pytest.raises(ResponsesError) as refused:
                await client.create(**SMALL, instructions="x" * 900_000)
            assert refused.value.code == "server_busy"
            assert (await client.create(**SMALL)).status == "completed"
    assert len(gzip.compress(over_budget)) < 20_000
    async with asyncio.timeout(10):
        await until(lambda: running.core.request_bytes.held == 0)
    # A refusal of the client's message is not a server fault.
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_http_body_with_content_encoding_is_refused_naming_it(
    http_server: RunningServer,
) -> None:
    """A gzip body is not inflated behind the limits' back, nor parsed as garbage: a 415 that
    names the encoding."""
    body = gzip.compress(orjson.dumps({**SMALL, "instructions": "w" * 1_000_000}))
    url = f"http://127.0.0.1:{http_server.http_port}/v1/responses"
    async with asyncio.timeout(30), httpx.AsyncClient(timeout=20) as http:
        reply = await http.post(
            url,
            content=body,
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        assert reply.status_code == 415, reply.text
        error = reply.json()["error"]
        assert error["code"] == "unsupported_content_encoding" and "gzip" in error["message"]
        assert (await http.post(url, json=SMALL)).status_code == 200


def _frames_held(parser: object) -> list[int]:
    """Payload sizes of the frames a suspended websockets parser (and the parsers it
    delegates to) still refers to."""
    sizes = []
    while isinstance(parser, types.GeneratorType):
        if parser.gi_frame is not None:
            frame = parser.gi_frame.f_locals.get("frame")
            if frame is not None:
                sizes.append(len(frame.data))
        parser = parser.gi_yieldfrom
    return sizes


@pytest.mark.parametrize("compression", [False, True], ids=["plain", "deflate"])
async def test_a_big_message_is_not_held_by_a_connection_gone_quiet(
    server_factory: ServerFactory, tmp_path: Path, compression: bool
) -> None:
    """The frame parser keeps its last frame until the next one arrives; a connection that
    sent a 20 MB message and then idles must not keep those 20 MB (16 such connections once
    held 1.2 GB). Looked up in the server's own protocol object, on a real connection."""
    config = make_config(tmp_path)
    config.limits.websocket_compression = compression
    running: RunningServer = await server_factory(config, http=True)
    assert running.http_port is not None
    event = {"type": "response.create", **SMALL, "input": "q" * 20_000_000}
    options = {"compression": "deflate" if compression else None}
    async with asyncio.timeout(30), connector(running.http_port)(**options) as sock:
        await sock.send(event)
        assert (await sock.recv())["type"] == "error"  # longer than an item may be
        assert bool(sock.ws.protocol.extensions) == compression
        protocols = [p for p in gc.get_objects() if issubclass(type(p), WebSocketProtocol)]
        held = [size for p in protocols for size in _frames_held(p.conn.parser)]
        assert protocols and all(size < 1_000_000 for size in held), held
