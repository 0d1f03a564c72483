"""Shared fixtures: a real server on loopback ports, and clients for it."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import openai
import pytest
from bidi_responses.bench.servers import fast_sim, sim_server_config
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.app import RunningServer, start_server
from bidi_responses.server.config import RouteConfig, ServerConfig
from bidi_responses.server.core.storage.sqlite_store import Store
from bidi_responses.server.core.storage.store import LedgerRow
from openai.resources.responses.responses import AsyncResponsesConnection
from openai.types.responses import FunctionToolParam, Response

# A fast engine for functional tests: high decode rate, no time to first token. Benchmarks
# use the headline operating point instead.
FAST_SIM = fast_sim(tool_rounds=3, answer_tokens=30)

# Typed for the openai SDK's parameters; the plain-dict form below is for raw JSON.
SHELL_TOOL_PARAM: FunctionToolParam = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command and return its output.",
    "parameters": {
        "type": "object",
        "properties": {
            "cmd": {"type": "string", "description": "the command"},
            "workdir": {"type": "string"},
            "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000},
        },
        "required": ["cmd"],
        "additionalProperties": False,
    },
    "strict": False,
}
SHELL_TOOL: dict[str, Any] = dict(SHELL_TOOL_PARAM)


M = TypeVar("M")


async def read_message(
    call: grpc.aio.StreamStreamCall[Any, M] | grpc.aio.UnaryStreamCall[Any, M], kind: type[M]
) -> M:
    """The next message of a streaming call (asserting the call has not ended)."""
    message = await call.read()
    assert isinstance(message, kind), f"the call ended: {message!r}"
    return message


async def websocket_turn(
    conn: AsyncResponsesConnection, *, model: str, input: str, previous_response_id: str | None
) -> Response:
    """One unstored ``response.create`` on an SDK WebSocket-mode connection: its completed
    response (asserting no error event comes first)."""
    await conn.response.create(
        model=model, input=input, previous_response_id=previous_response_id, store=False
    )
    async for event in conn:
        assert event.type != "error", event
        if event.type == "response.completed":
            return event.response
    raise AssertionError("the connection closed before response.completed")


async def ledger_by_id(running: RunningServer) -> dict[str, LedgerRow]:
    """The usage ledger of a (stopped) server's store, by response id."""
    store = Store(Path(running.core.config.store_path))
    try:
        return {row.response_id: row for row in await store.ledger_rows()}
    finally:
        store.close()


def run_cli(*args: str, timeout: float = 110) -> subprocess.CompletedProcess[str]:
    """``bidi-responses ARGS`` in a child process, asserting it succeeds (with its output)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bidi_responses.server.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def make_config(tmp_path: Path, **sim: Any) -> ServerConfig:
    """A config on free loopback ports with a private data dir."""
    settings = dataclasses.replace(FAST_SIM, **sim)
    config = sim_server_config(tmp_path / "data", settings)
    config.models["sim-other"] = RouteConfig(engine="sim", sim=settings)
    return config


ServerFactory = Callable[..., Any]


def background_config(tmp_path: Path) -> ServerConfig:
    """Routes for background-mode tests: "sim-model" answers in about 1 s (200 tokens at 200
    tokens/s), "sim-other" takes minutes, so it is still running whenever a test cancels it."""
    config = make_config(tmp_path, tokens_per_second=200, answer_tokens=200)
    endless = dataclasses.replace(config.models["sim-other"].sim, answer_tokens=50_000)
    config.models["sim-other"] = RouteConfig(engine="sim", sim=endless)
    return config


@pytest.fixture
async def server_factory(tmp_path: Path) -> AsyncIterator[ServerFactory]:
    """Start servers with custom settings; all are stopped at the end of the test."""
    started: list[RunningServer] = []

    async def start(
        config: ServerConfig | None = None, *, http: bool = False, **sim: Any
    ) -> RunningServer:
        running = await start_server(config or make_config(tmp_path, **sim), http=http)
        started.append(running)
        return running

    yield start
    for running in started:
        await running.stop(grace=0)


@pytest.fixture
async def server(server_factory: ServerFactory) -> RunningServer:
    """A gRPC-only server on the fast sim engine."""
    running: RunningServer = await server_factory()
    return running


@pytest.fixture
async def http_server(server_factory: ServerFactory) -> RunningServer:
    """gRPC plus HTTP+SSE and WebSocket mode on the fast sim engine."""
    running: RunningServer = await server_factory(http=True)
    return running


@pytest.fixture
async def sdk(http_server: RunningServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official openai SDK pointed at ``http_server`` (no retries: a failure shows at once;
    ``responses.connect()`` derives ws://.../v1/responses from the base URL)."""
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{http_server.http_port}/v1",
        api_key="test",
        max_retries=0,
        timeout=10,
    )
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[AsyncResponsesClient]:
    """Our async client connected to ``server``."""
    async with AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as c:
        yield c


async def collect_until_terminal(events: Any) -> list[dict[str, Any]]:
    """Read events from an async iterator up to a terminal, error or response.done event."""
    seen: list[dict[str, Any]] = []
    async for event in events:
        seen.append(event)
        if event["type"] in (
            "response.completed",
            "response.failed",
            "response.incomplete",
            "error",
            "response.done",
        ):
            break
    return seen


async def until(predicate: Callable[[], bool], interval_s: float = 0.002) -> None:
    """Poll ``predicate`` until it holds (callers bound the wait with ``asyncio.timeout``);
    for state that another process or a background task changes without an event to await."""
    while True:
        if predicate():
            return
        await asyncio.sleep(interval_s)
