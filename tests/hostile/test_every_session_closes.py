"""Every session closes, whatever is cancelled when: after a mix of undecodable messages,
errors, cancels at every point and vanished connections, on gRPC and WebSocket, no stream is
counted open (the gauge, the core's count, the tenant's) and the tenant is served again up to
its full limit."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
import websockets
from bidi_responses.codec import params_to_pb
from bidi_responses.server.app import RunningServer
from bidi_responses.v1 import responses_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerFactory, until
from tests.mesh.conftest import bearer, keyed_config

pytestmark = pytest.mark.timeout(120)

CONNECT = "/bidi_responses.v1.ResponsesService/Connect"
TENANT_LIMIT = 8
# Calls that send an undecodable message, read the error and cancel at once (the case that
# leaked about 1 session in 200), then calls that end in every other way.
ERROR_THEN_CANCEL = 480
MIXED = 160
UNDECODABLE = b"\xff\xff\xff\xff"
CREATE = pb.ConnectRequest(
    response_create=params_to_pb({"model": "sim-model", "input": "hi", "store": False})
).SerializeToString()


async def _grpc_call(channel: grpc.aio.Channel, plan: int, rng: random.Random) -> None:
    """One Connect call that ends in one of the ways a client can end it (plan 0: an
    undecodable message, its error event read, then a cancel at once)."""
    connect: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
        CONNECT, request_serializer=None, response_deserializer=None
    )
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    queue.put_nowait(UNDECODABLE if plan % 2 == 0 else CREATE)

    async def requests() -> AsyncIterator[bytes]:
        while (item := await queue.get()) is not None:
            yield item

    call = connect(requests(), metadata=bearer("key-a"))
    try:
        if plan == 0 or plan % 3 != 0:
            await call.read()  # the error event, or the first event of the create
        if plan % 5 != 0:
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)  # cancel at a different point of the server's work
    finally:
        call.cancel()  # most often right after the error event: the case that leaked


async def _websocket_connection(port: int, plan: int) -> None:
    """One WebSocket connection that sends something bad or a create, then vanishes."""
    async with websockets.connect(
        f"ws://127.0.0.1:{port}/v1/responses", additional_headers={"authorization": "Bearer key-a"}
    ) as ws:
        await ws.send("{not json" if plan % 2 == 0 else orjson.dumps(
            {"type": "response.create", "model": "sim-model", "input": "hi", "store": False}
        ).decode())  # fmt: skip
        if plan % 3 != 0:
            await ws.recv()
        ws.transport.abort()  # no close handshake: the connection is just gone


async def _open_streams(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "bidi_open_streams"
    )


async def _tenant_serves_its_whole_limit(running: RunningServer) -> None:
    """``TENANT_LIMIT`` streams of the tenant open together and each takes a turn."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
        connect: grpc.aio.StreamStreamMultiCallable[bytes, pb.ConnectResponse] = (
            channel.stream_stream(
                CONNECT,
                request_serializer=None,
                response_deserializer=pb.ConnectResponse.FromString,
            )
        )
        calls = [connect(iter([CREATE]), metadata=bearer("key-a")) for _ in range(TENANT_LIMIT)]
        for call in calls:
            kinds = [message.WhichOneof("event") async for message in call]
            assert "response_completed" in kinds, kinds
            assert await call.code() == grpc.StatusCode.OK


async def test_no_session_is_left_open_after_errors_cancels_and_disconnects(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    await hammer(server_factory, tmp_path, ERROR_THEN_CANCEL, MIXED)


async def hammer(
    server_factory: ServerFactory, tmp_path: Path, error_then_cancel: int, mixed: int
) -> None:
    """``error_then_cancel`` calls of the case that leaked, then ``mixed`` calls ending in
    every other way, at most the tenant's limit at once; then nothing may be counted open."""
    config = keyed_config(tmp_path)
    config.tenant_limits.max_streams_per_tenant = TENANT_LIMIT
    running: RunningServer = await server_factory(config, http=True)
    core = running.core
    http_port = running.http_port
    assert http_port is not None
    rng = random.Random(30)
    async with (
        asyncio.timeout(100 + (error_then_cancel + mixed) / 10),
        grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as http,
    ):
        for start in range(0, error_then_cancel + mixed, TENANT_LIMIT):
            # At most the tenant's limit at once: a refusal would hide a leak.
            plans = [0 if n < error_then_cancel else n for n in range(start, start + TENANT_LIMIT)]
            await asyncio.gather(
                *(
                    _grpc_call(channel, plan, rng)
                    if plan % 4 != 3
                    else _websocket_connection(http_port, plan)
                    for plan in plans
                ),
                return_exceptions=True,
            )
            # Each batch's streams are gone before the next: none may linger.
            try:
                async with asyncio.timeout(10):
                    await until(lambda: core.sessions_open == 0)
            except TimeoutError:
                pytest.fail(f"{core.sessions_open} sessions left open after calls {plans}")
        assert await _open_streams(http) == 0
        assert not core.deps.state.inflight
        await _tenant_serves_its_whole_limit(running)
        await until(lambda: core.sessions_open == 0)
        assert await _open_streams(http) == 0
