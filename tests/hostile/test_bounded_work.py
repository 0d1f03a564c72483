"""Bounded work per request, fair between streams: a huge create does not stop other streams,
the server-wide budget on request bytes refuses with a retryable 429 on every transport, the
work bound names its field, and an open server counts streams per connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import httpx
import pytest
import websockets
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.client.types import JSONValue
from bidi_responses.server.app import RunningServer

from tests.conftest import ServerFactory, make_config
from tests.ws.conftest import connector, final

SMALL: dict[str, JSONValue] = {"model": "sim-model", "input": "hi", "store": False}


async def test_small_streams_complete_turns_while_a_huge_create_is_prepared(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """A create whose instructions are 4 M characters of one letter (tokenizing them takes
    the better part of a second) is prepared in a worker thread: another stream completes
    several turns before the big one's first event, and the big one completes too."""
    running: RunningServer = await server_factory(make_config(tmp_path))
    target = f"127.0.0.1:{running.grpc_port}"
    async with (
        AsyncResponsesClient(target) as big_client,
        AsyncResponsesClient(target) as small_client,
        big_client.connect() as big,
        small_client.connect() as small,
    ):
        await small.create(**SMALL)  # warm: the small stream is established and served
        big_done = asyncio.Event()
        turns_during = 0

        async def small_turns() -> None:
            nonlocal turns_during
            while not big_done.is_set():
                response = await small.create(**SMALL)
                assert response.status == "completed"
                if not big_done.is_set():
                    turns_during += 1

        async def huge() -> str:
            try:
                first = None
                async for event in big.create_events(
                    model="sim-model", instructions="a" * 4_000_000, input="go", store=False
                ):
                    first = first or event
                    if event["type"] in ("response.completed", "error"):
                        return str(event["type"])
                return "closed"
            finally:
                big_done.set()

        async with asyncio.timeout(120):
            outcome, _ = await asyncio.gather(huge(), small_turns())
    assert outcome == "response.completed"
    assert turns_during >= 5, turns_during


async def test_instructions_past_the_work_bound_get_a_400_naming_them(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    config.limits.max_item_chars = 1000
    running: RunningServer = await server_factory(config)
    async with (
        asyncio.timeout(30),
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
        client.connect() as stream,
    ):
        with pytest.raises(ResponsesError) as raised:
            await stream.create(**SMALL, instructions="x" * 1001)
        assert raised.value.code == "string_above_max_length"
        assert raised.value.param == "instructions"
        assert (await stream.create(**SMALL, instructions="x" * 1000)).status == "completed"
        tool = {
            "type": "function",
            "name": "f",
            "description": "d" * 1000,
            "parameters": {"type": "object"},
        }
        with pytest.raises(ResponsesError) as raised:
            await stream.create(**SMALL, tools=[tool])
        assert raised.value.code == "input_too_large" and raised.value.param == "tools"


async def test_request_bytes_past_the_server_wide_budget_get_a_retryable_429(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """Every transport: a message larger than what the budget has free is refused with
    ``server_busy`` saying it is the server-wide budget; the stream or connection goes on."""
    config = make_config(tmp_path)
    config.limits.max_inflight_request_bytes = 1_000_000
    running: RunningServer = await server_factory(config, http=True)
    big = "y" * 1_200_000
    async with asyncio.timeout(60):
        # HTTP: 429 with the limit named.
        async with httpx.AsyncClient(timeout=30) as http:
            url = f"http://127.0.0.1:{running.http_port}/v1/responses"
            reply = await http.post(url, json={**SMALL, "instructions": big})
            assert reply.status_code == 429, reply.text
            error = reply.json()["error"]
            assert error["code"] == "server_busy" and "server-wide" in error["message"]
            assert (await http.post(url, json=SMALL)).status_code == 200
        # gRPC: the stateless call ends RESOURCE_EXHAUSTED; a Connect stream gets an error
        # event and serves the next turn.
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client:
            with pytest.raises(ResponsesError) as raised:
                await client.create(**SMALL, instructions=big)
            assert raised.value.code == "server_busy"
            async with client.connect() as stream:
                with pytest.raises(ResponsesError) as raised:
                    await stream.create(**SMALL, instructions=big)
                assert raised.value.code == "server_busy" and raised.value.status == 429
                assert (await stream.create(**SMALL)).status == "completed"
                # On another lane too: the refusal reaches the lane that sent the message.
                with pytest.raises(ResponsesError) as raised:
                    await stream.create(stream_id="side", **SMALL, instructions=big)
                assert raised.value.code == "server_busy"
                assert (await stream.create(stream_id="side", **SMALL)).status == "completed"
        # WebSocket mode: a frame is refused while it is read (close 1013, try again later,
        # saying why) and a new connection is served. A client offering compression (the
        # default of the websockets library) is not granted it (limits.websocket_compression
        # is off), so its frames are counted as they are; tests/ws/test_ws_limits.py covers
        # compression turned on.
        assert running.http_port is not None
        connect = connector(running.http_port)
        async with connect() as sock:
            assert sock.ws.protocol.extensions == []
            assert final(await sock.create(**SMALL))["status"] == "completed"
        async with connect(compression=None) as sock:
            await sock.send({"type": "response.create", **SMALL, "instructions": big})
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await sock.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1013 and "budget" in closed.value.rcvd.reason
        async with connect() as sock:
            assert final(await sock.create(**SMALL))["status"] == "completed"
    assert running.core.request_bytes.held == 0  # every charge was given back


async def test_open_server_counts_streams_per_connection(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """Without API keys, one client holding its connection's stream quota does not lock out
    another connection."""
    config = make_config(tmp_path)
    config.tenant_limits.max_streams_per_tenant = 2
    running: RunningServer = await server_factory(config)
    target = f"127.0.0.1:{running.grpc_port}"
    async with (
        asyncio.timeout(30),
        AsyncResponsesClient(target) as hog,
        # Its own connection: channels in one process share connections unless told not to.
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as own,
        AsyncResponsesClient(target, channel=own) as other,
        hog.connect() as first,
        hog.connect() as second,
    ):
        assert (await first.create(**SMALL)).status == "completed"
        assert (await second.create(**SMALL)).status == "completed"
        with pytest.raises(ResponsesError) as raised:
            async with hog.connect() as third:
                await third.create(**SMALL)
        # The client may see the refusal as its stream closing before its first turn.
        assert raised.value.code in ("rate_limit_exceeded", "stream_closed")
        async with other.connect() as mine:
            assert (await mine.create(**SMALL)).status == "completed"
