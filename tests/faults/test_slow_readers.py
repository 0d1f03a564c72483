"""A client that stops reading is cut off after the write timeout, with a clear status, and
its engine work is cancelled; memory stays bounded meanwhile (the heavy version measures it)."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import grpc
import orjson
import pytest
from bidi_responses.server.app import RunningServer
from bidi_responses.server.config import ServerConfig
from bidi_responses.server.core.storage.sqlite_schema import read_ledger

from tests.conftest import ServerFactory, make_config, until
from tests.faults.slow_clients import BIG, StalledGrpc, StalledWebSocket, big_creates

LANES = 8  # 8 x 2 x 1 MiB of events: more than socket and HTTP/2 buffers hold


def _slow_config(tmp_path: Path) -> ServerConfig:
    # A slow engine, so that the generating lane is still in flight when the cut comes.
    config = make_config(tmp_path, tokens_per_second=200, answer_tokens=100_000)
    config.limits.write_timeout_s = 0.5
    return config


def _ledger(running: RunningServer) -> dict[str, str]:
    return {row.response_id: row.status for row in read_ledger(running.core.config.store_path)}


# A lane that generates for a long time, while the client stops reading.
GENERATING = {
    "type": "response.create",
    "stream_id": "gen",
    "model": "sim-model",
    "input": "write a long essay",
    "store": False,
}


async def _cut_off(
    running: RunningServer, client: StalledGrpc | StalledWebSocket
) -> tuple[grpc.StatusCode | int, str]:
    """Flood a client that never reads until the server cuts it off; the stream and its engine
    work must go with it. The client's outcome (status or close code, and its text)."""
    core = running.core
    try:
        await client.send([GENERATING])
        await until(lambda: len(core.deps.state.inflight) == 1)
        await client.send(big_creates(LANES))
        await until(lambda: core.counters.write_timeouts == 1)
        await until(lambda: not core.deps.state.inflight and core.sessions_open == 0)
        outcome = await client.outcome()
    finally:
        await client.close()
    await core.deps.post.join()
    assert "cancelled" in _ledger(running).values()
    return outcome


async def test_a_grpc_client_that_stops_reading_is_cut_off(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(60):
        running: RunningServer = await server_factory(_slow_config(tmp_path))
        code, details = await _cut_off(running, StalledGrpc(running.grpc_port))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "write timeout" in details


async def test_a_websocket_client_that_stops_reading_is_closed_1008(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(60):
        running: RunningServer = await server_factory(_slow_config(tmp_path), http=True)
        assert running.http_port is not None
        client = await StalledWebSocket.open(running.http_port)
        code, reason = await _cut_off(running, client)
    assert code == 1008
    assert "write timeout" in reason


async def test_an_sse_client_that_stops_reading_loses_its_connection(
    server_factory: ServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="uvicorn.error")
    async with asyncio.timeout(60):
        config = _slow_config(tmp_path)
        running: RunningServer = await server_factory(config, http=True)
        assert running.http_port is not None
        core = running.core
        body = orjson.dumps(
            {
                "model": "sim-model",
                "stream": True,
                "store": False,
                # Echoed in every snapshot event: megabytes the client will not read.
                "instructions": big_creates(1, 3 * BIG)[0]["instructions"],
                "input": "write a long essay",
            }
        )
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", running.http_port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        try:
            writer.write(
                b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            await until(lambda: core.counters.write_timeouts == 1)
            await until(lambda: not core.deps.state.inflight)
            # The connection ends after what was buffered (no terminal event was sent).
            received = await reader.read()  # to end of file
        finally:
            writer.close()
        assert received.startswith(b"HTTP/1.1 200")
        assert b"response.completed" not in received
        await core.deps.post.join()
        assert "cancelled" in _ledger(running).values()
    # A handled outcome, logged as one: no ERROR from the HTTP server for the cut stream.
    logged = [r for r in caplog.records if r.name == "uvicorn.error"]
    assert [r.levelname for r in logged] == ["INFO"]
    assert "stopped reading" in logged[0].getMessage()
