"""The upstream Responses engine against a second, real ``bidi-responses serve`` process.

The upstream runs the sim engine; the local server routes ``relay`` to it. An agent loop on
one local Connect stream must reach the upstream as one WebSocket-mode connection that chains
``previous_response_id`` (the upstream's own stats show its connection cache reused and only
new items validated), and the HTTP wire must work as the fallback. The upstream's counters
are read over its own HTTP API.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
from aiohttp import web
from bidi_responses.bench.ports import free_port
from bidi_responses.bench.servers import serve_command
from bidi_responses.client import AgentResult, AsyncResponsesClient, run_agent_loop
from bidi_responses.server.config import RouteConfig, ServerConfig
from bidi_responses.server.engine_config import UpstreamConfig

from tests.conftest import FAST_SIM, SHELL_TOOL, ServerFactory, websocket_turn

UPSTREAM_TOML = """
[models.sim-model]
engine = "sim"
[models.sim-model.sim]
tokens_per_second = 1000000.0
ttft_ms = 0.0
tool_rounds = 3

[models.sim-slow]
engine = "sim"
[models.sim-slow.sim]
tokens_per_second = 50.0
ttft_ms = 0.0
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second ``bidi-responses serve`` process on the sim engine, for the module; yields its
    HTTP base URL once it answers ``/healthz``. Its output goes to a file, so no reader is
    needed while tests run on their own event loops."""
    directory = tmp_path_factory.mktemp("upstream")
    config = directory / "server.toml"
    config.write_text(UPSTREAM_TOML, encoding="utf-8")
    grpc_port, http_port = free_port(), free_port()
    with open(directory / "server.log", "wb") as log:
        process = subprocess.Popen(
            serve_command(
                config,
                grpc_port=grpc_port,
                http_port=http_port,
                data_dir=directory / "data",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{http_port}/v1"
    try:
        deadline = time.monotonic() + 30
        while True:  # readiness: poll the health endpoint, with a deadline
            assert process.poll() is None, (directory / "server.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=1).is_success:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (directory / "server.log").read_text()
            time.sleep(0.05)
        yield base_url
    finally:
        process.kill()
        process.wait()


async def _stats(base_url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        data: dict[str, Any] = (await client.get(base_url + "/stats")).json()
    return data


def _config(tmp_path: Path, base_url: str, transport: str) -> ServerConfig:
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "local"))
    relay = UpstreamConfig(base_url=base_url, model="sim-model", transport=transport)
    slow = UpstreamConfig(base_url=base_url, model="sim-slow", transport=transport)
    config.models = {
        "relay": RouteConfig(engine="upstream", upstream=relay),
        "relay-slow": RouteConfig(engine="upstream", upstream=slow),
        "sim-model": RouteConfig(engine="sim", sim=FAST_SIM),
    }
    return config


async def _agent_loop(address: str) -> AgentResult:
    async with AsyncResponsesClient(address) as client, client.connect() as stream:
        return await run_agent_loop(
            stream,
            model="relay",
            input="List the files, then summarise.",
            tools=[SHELL_TOOL],
            functions={"exec_command": lambda args: f"ran {args.get('cmd')}: a.txt b.txt"},
            mode="chain",
        )


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_agent_loop_through_an_upstream(
    tmp_path: Path, server_factory: ServerFactory, upstream: str, transport: str
) -> None:
    base_url = upstream
    async with asyncio.timeout(60):
        running = await server_factory(_config(tmp_path, base_url, transport))
        before = await _stats(base_url)
        result = await _agent_loop(f"127.0.0.1:{running.grpc_port}")
        after = await _stats(base_url)
        # The sim model called the tool three times, then answered; every call id the client
        # answered was the upstream's own, or the upstream would have rejected the output.
        assert result.final.status == "completed"
        assert result.final.output_text
        responses = after["responses_total"] - before["responses_total"]
        assert responses == 4
        validated = after["items_validated_total"] - before["items_validated_total"]
        reused = after["tokens_reused_total"] - before["tokens_reused_total"]
        if transport == "websocket":
            # One connection, chained: the upstream validated only the new items (the first
            # user message, then one tool output per turn) and reused its cache each turn.
            assert validated == 4
            assert reused > 0
        else:
            # The HTTP fallback sends the whole conversation each turn (store is off).
            assert validated == 1 + 3 + 5 + 7
            assert reused == 0
        # The local stages too saw only the new items on the local stream.
        local = running.core.counters.snapshot()
        assert local["items_validated_total"] == 4
        # The local stream closed, so did its upstream connection.
        async with asyncio.timeout(5):
            await _until_no_streams(base_url)


async def _until_no_streams(base_url: str) -> None:
    """Poll the upstream's stats until it has no stream open (the caller sets the deadline)."""
    while True:
        if (await _stats(base_url))["streams_open"] == 0:
            return
        await asyncio.sleep(0.05)


@asynccontextmanager
async def http_only_proxy(upstream: str) -> AsyncIterator[str]:
    """An HTTP-only front for ``upstream``: it relays POST /v1/responses and refuses the
    WebSocket upgrade (404), like a gateway without WebSocket support."""
    session = aiohttp.ClientSession()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with session.post(upstream + "/responses", data=body, headers=_JSON) as answer:
            response = web.StreamResponse(
                status=answer.status,
                headers={"Content-Type": answer.headers.get("Content-Type", "")},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            return response

    app = web.Application()
    app.router.add_post("/v1/responses", relay)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        await runner.cleanup()
        await session.close()


_JSON = {"Content-Type": "application/json"}


async def test_auto_falls_back_to_http_when_websocket_is_refused(
    tmp_path: Path, server_factory: ServerFactory, upstream: str
) -> None:
    base_url = upstream
    async with asyncio.timeout(60), http_only_proxy(base_url) as proxy:
        running = await server_factory(_config(tmp_path, proxy, "auto"))
        before = await _stats(base_url)
        result = await _agent_loop(f"127.0.0.1:{running.grpc_port}")
        after = await _stats(base_url)
        assert result.final.status == "completed"
        assert after["responses_total"] - before["responses_total"] == 4
        # Every turn went over HTTP with the whole conversation.
        assert after["items_validated_total"] - before["items_validated_total"] == 1 + 3 + 5 + 7


async def test_cancel_closes_the_upstream_connection_and_the_lane_goes_on(
    tmp_path: Path, server_factory: ServerFactory, upstream: str
) -> None:
    base_url = upstream
    async with asyncio.timeout(60):
        running = await server_factory(_config(tmp_path, base_url, "websocket"))
        address = f"127.0.0.1:{running.grpc_port}"
        async with AsyncResponsesClient(address) as client, client.connect() as stream:
            response_id = ""
            events = stream.create_events(model="relay-slow", input="Tell me a long story.")
            async for event in events:
                if event["type"] == "response.created":
                    response_id = event["response"]["id"]
                if event["type"] == "response.output_text.delta":
                    break
            await events.aclose()
            assert (await _stats(base_url))["streams_open"] == 1
            await stream.cancel(response_id)
            async for event in stream.events():
                if event["type"] == "response.incomplete":
                    break
            # The upstream connection was closed, which stopped the upstream's response.
            async with asyncio.timeout(5):
                await _until_no_streams(base_url)
            # The lane goes on, over a new upstream connection.
            follow = await stream.create(model="relay-slow", input="Shorter.", max_output_tokens=16)
            assert follow.status in ("completed", "incomplete")
            assert (await _stats(base_url))["streams_open"] == 1


async def test_a_local_websocket_connection_chains_upstream_too(
    tmp_path: Path, server_factory: ServerFactory, upstream: str
) -> None:
    running = await server_factory(_config(tmp_path, upstream, "websocket"), http=True)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{running.http_port}/v1", api_key="test", max_retries=0
    )
    try:
        async with asyncio.timeout(30), client.responses.connect() as conn:
            before = await _stats(upstream)
            previous = None
            for turn in range(3):
                completed = await websocket_turn(
                    conn, model="relay", input=f"Question {turn}.", previous_response_id=previous
                )
                previous = completed.id
            after = await _stats(upstream)
    finally:
        await client.close()
    # Three turns, one new item each, all on one upstream connection's chain.
    assert after["responses_total"] - before["responses_total"] == 3
    assert after["items_validated_total"] - before["items_validated_total"] == 3
    assert after["tokens_reused_total"] > before["tokens_reused_total"]
