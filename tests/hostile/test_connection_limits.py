"""Connections are a bounded resource: one address holding its share of the HTTP listener is
refused with a reason (HTTP 429, the WebSocket upgrade denied with 429) while other
addresses, and gRPC, are served; a full listener answers 503; the accounting returns to zero."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import websockets
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.client.types import JSONValue
from bidi_responses.server.app import RunningServer
from bidi_responses.server.transports.connections import ConnectionAccount

from tests.conftest import ServerFactory, make_config, until
from tests.ws.conftest import RawSocket, final

SMALL: dict[str, JSONValue] = {"model": "sim-model", "input": "hi", "store": False}


def _client(running: RunningServer, source: str) -> httpx.AsyncClient:
    """An HTTP client whose connections come from the loopback address ``source``."""
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{running.http_port}",
        transport=httpx.AsyncHTTPTransport(local_address=source),
        timeout=10,
    )


@contextlib.asynccontextmanager
async def _ws(running: RunningServer, source: str) -> AsyncIterator[RawSocket]:
    async with websockets.connect(
        f"ws://127.0.0.1:{running.http_port}/v1/responses",
        local_addr=(source, 0),
        compression=None,
    ) as ws:
        yield RawSocket(ws)


@contextlib.asynccontextmanager
async def _held(running: RunningServer, source: str, count: int) -> AsyncIterator[None]:
    """``count`` WebSocket-mode connections from ``source``, held open (unlike an idle
    keep-alive connection, which the server closes after a few seconds)."""
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(count):
            await stack.enter_async_context(_ws(running, source))
        yield


def _gauge(metrics: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", metrics, re.MULTILINE)
    assert found, name
    return float(found[1])


async def test_one_address_past_its_share_is_refused_and_others_are_served(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    config.limits.max_connections_per_peer = 8
    running: RunningServer = await server_factory(config, http=True)
    async with asyncio.timeout(60), _held(running, "127.0.0.1", 8):
        # The ninth from the same address: 429 with the limit named, then closed.
        async with _client(running, "127.0.0.1") as extra:
            reply = await extra.post("/v1/responses", json=SMALL)
            assert reply.status_code == 429, reply.text
            assert reply.headers["connection"] == "close" and reply.headers["retry-after"]
            error = reply.json()["error"]
            assert error["code"] == "too_many_connections"
            assert "max_connections_per_peer" in error["message"]
        # A WebSocket upgrade from it: denied with the same 429 and body.
        with pytest.raises(websockets.InvalidStatus) as denied:
            async with _ws(running, "127.0.0.1"):
                pass
        assert denied.value.response.status_code == 429
        assert b"too_many_connections" in denied.value.response.body
        # Another address is served on HTTP and WebSocket mode, and gRPC is untouched.
        async with _client(running, "127.0.0.2") as other:
            assert (await other.post("/v1/responses", json=SMALL)).status_code == 200
        async with _ws(running, "127.0.0.2") as sock:
            assert final(await sock.create(**SMALL))["status"] == "completed"
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as grpc_client:
            assert (await grpc_client.create(**SMALL)).status == "completed"
    # Once the address closes its connections, it is served again and nothing is left held.
    async with asyncio.timeout(30), _client(running, "127.0.0.1") as again:
        await until(lambda: _open_http(running) <= 1)
        assert (await again.post("/v1/responses", json=SMALL)).status_code == 200
        metrics = (await again.get("/metrics")).text
        assert _gauge(metrics, 'bidi_open_connections{transport="http"}') == 1
        refused = 'bidi_connections_refused_total{reason="peer",transport="http"}'
        assert _gauge(metrics, refused) >= 2
        assert _gauge(metrics, 'bidi_connection_limit{scope="peer",transport="http"}') == 8


def _open_http(running: RunningServer) -> float:
    gauge = running.core.metrics.open_connections.labels("http")
    return float(gauge._value.get())


async def test_a_full_listener_answers_503_and_recovers(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    config.limits.max_connections = 6
    config.limits.max_connections_per_peer = 0
    running: RunningServer = await server_factory(config, http=True)
    async with asyncio.timeout(60):
        async with _held(running, "127.0.0.3", 6), _client(running, "127.0.0.2") as other:
            reply = await other.post("/v1/responses", json=SMALL)
            assert reply.status_code == 503, reply.text
            error = reply.json()["error"]
            assert error["code"] == "too_many_connections"
            assert "limits.max_connections" in error["message"]
        await until(lambda: _open_http(running) == 0)
        async with _client(running, "127.0.0.2") as other:
            assert (await other.post("/v1/responses", json=SMALL)).status_code == 200


async def test_a_silent_refused_connection_is_closed(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """A connection past the limit that never sends a request does not keep its descriptor:
    the server ends it (REFUSAL_GRACE_S), and the count goes back down."""
    config = make_config(tmp_path)
    config.limits.max_connections_per_peer = 2
    running: RunningServer = await server_factory(config, http=True)
    async with asyncio.timeout(30), _held(running, "127.0.0.1", 2):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", running.http_port, local_addr=("127.0.0.1", 0)
        )
        try:
            await until(lambda: _open_http(running) == 3)
            assert await reader.read() == b""  # the server closed it
            await until(lambda: _open_http(running) == 2)
        finally:
            writer.close()


def test_the_account_counts_every_outcome() -> None:
    """Admit and release in any order leave nothing behind; refusals pending are bounded."""
    from bidi_responses.server.transports.connections import ConnectionCaps

    account = ConnectionAccount(ConnectionCaps(1024, 4, 4, 2), max_refusing=2)
    assert account.admit("a", 1) is None and account.admit("a", 2) is None
    refused = account.admit("a", 3)
    assert refused and refused.status == 429
    assert account.refusal("a", 3) is refused
    assert account.admit("b", 1) is None and account.admit("c", 1) is None
    full = account.admit("d", 1)
    assert full and full.status == 503
    assert account.admit("d", 2) is False  # two refusals already pending
    for host, port in (("a", 3), ("d", 1), ("a", 1), ("a", 2), ("b", 1), ("c", 1)):
        account.release(host, port)
    assert account.open == 0 and account.held_by("a") == 0 and account.refusal("a", 3) is None
