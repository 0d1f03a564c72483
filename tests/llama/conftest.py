"""A real llama.cpp server (xllamacpp's prebuilt CPU build) serving a model made at test time.

The model file is written once per session (``tiny_gguf``) and one llama.cpp server serves it
for the whole session, on a free loopback port, with one slot so that its prefix (KV) cache
follows the conversation under test. Its ``/slots`` and ``/metrics`` endpoints are on, so the
tests check from the backend's side what it received, reused and aborted.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import xllamacpp
from aiohttp import web
from bidi_responses.bench.tiny_gguf import N_CTX, write_tiny_model
from bidi_responses.server.config import RouteConfig, ServerConfig
from bidi_responses.server.core.rendering import tokenizer
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engine_config import CompletionsConfig

from tests.conftest import FAST_SIM
from tests.llama.open_gguf import write_open_model

_METRIC = re.compile(r"^llamacpp:(\w+) ([0-9.eE+-]+)$", re.M)


@dataclass(frozen=True, slots=True)
class LlamaBackend:
    """The running llama.cpp server: its OpenAI base URL and its monitoring endpoints."""

    url: str  # http://127.0.0.1:PORT

    @property
    def base_url(self) -> str:
        """What a completions route points at."""
        return self.url + "/v1"

    async def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters, without the ``llamacpp:`` prefix."""
        async with httpx.AsyncClient(timeout=10) as client:
            text = (await client.get(self.url + "/metrics")).text
        return {name: float(value) for name, value in _METRIC.findall(text)}

    async def slots(self) -> list[dict[str, Any]]:
        """The server's slots, as ``/slots`` reports them."""
        async with httpx.AsyncClient(timeout=10) as client:
            data: list[dict[str, Any]] = (await client.get(self.url + "/slots")).json()
        return data


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model file, written once per session."""
    path = tmp_path_factory.mktemp("llama") / "tiny.gguf"
    return write_tiny_model(path, load_encoding())


@contextlib.contextmanager
def serving(
    model: Path, *, n_ctx: int, jinja: bool = False, slots: bool = False, metrics: bool = False
) -> Iterator[LlamaBackend]:
    """llama.cpp serving ``model`` on a free loopback port, one slot and one thread (with its
    Jinja chat template, its /slots and /metrics endpoints where asked), while the block runs."""
    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.n_ctx = n_ctx
    params.n_parallel = 1
    params.port = 0
    params.use_jinja = jinja
    params.endpoint_slots = slots
    params.endpoint_metrics = metrics
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    server = xllamacpp.Server(params)
    try:
        yield LlamaBackend(str(server.listening_address).rstrip("/"))
    finally:
        del server  # the destructor stops llama.cpp's loop and HTTP threads


@pytest.fixture(scope="session")
def llama_backend(tiny_model: Path) -> Iterator[LlamaBackend]:
    """llama.cpp serving the tiny model on a free loopback port, for the whole session."""
    with serving(tiny_model, n_ctx=N_CTX, slots=True, metrics=True) as backend:
        yield backend


# Every special token (and the unassigned id below them): banning them keeps the model in
# the message body, where it rambles on until its budget or a cancel.
RAMBLE_BIAS = {
    str(token): -100 for token in (199998, *range(tokenizer.ENDOFTEXT, tokenizer.ENDOFPROMPT + 1))
}


def completions_route(base_url: str, **settings: Any) -> RouteConfig:
    """A completions route on ``base_url`` with test-sized limits."""
    values: dict[str, Any] = {
        "context_window": N_CTX,
        "max_output_tokens": 64,
        "first_token_timeout_s": 30.0,
        "idle_timeout_s": 10.0,
        "retry_backoff_s": 0.01,
    }
    values.update(settings)
    return RouteConfig(
        engine="completions", completions=CompletionsConfig(base_url=base_url, **values)
    )


def llama_config(tmp_path: Path, backend: LlamaBackend, **routes: RouteConfig) -> ServerConfig:
    """A server on free ports with ``tiny`` (llama.cpp), ``sim-model`` and ``routes``."""
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
    config.models = {
        "tiny": completions_route(backend.base_url),
        "sim-model": RouteConfig(engine="sim", sim=FAST_SIM),
        **routes,
    }
    return config


@pytest.fixture(scope="session")
def open_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The open model's GGUF file (``open_gguf``), written once per session."""
    return write_open_model(tmp_path_factory.mktemp("open-model") / "open.gguf")


@pytest.fixture(scope="session")
def open_backend(open_model: Path) -> Iterator[LlamaBackend]:
    """llama.cpp serving the open model with its Jinja chat template, one slot."""
    with serving(open_model, n_ctx=4096, jinja=True, metrics=True) as backend:
        yield backend


@dataclass
class Recorder:
    """A loopback proxy in front of llama.cpp that keeps each request body it forwards and
    the usage the backend reported for it; ``grammar``, when set, is added to the requests
    it forwards (llama.cpp's per-request GBNF), which steers what the model writes."""

    target: str
    bodies: list[dict[str, Any]] = field(default_factory=list)
    usages: list[dict[str, Any]] = field(default_factory=list)
    grammar: str | None = None
    url: str = ""


@pytest.fixture
async def recorder(open_backend: LlamaBackend) -> AsyncIterator[Recorder]:
    """A recording proxy in front of the open model's llama.cpp."""
    async with recording_proxy(open_backend) as recording:
        yield recording


@contextlib.asynccontextmanager
async def recording_proxy(backend: LlamaBackend) -> AsyncIterator[Recorder]:
    """A ``Recorder`` on a free loopback port in front of ``backend``."""
    recording = Recorder(backend.url)
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        recording.bodies.append(body)
        sent = dict(body)
        if recording.grammar is not None:
            sent["grammar"] = recording.grammar
        async with session.post(recording.target + request.path, json=sent) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            seen = bytearray()
            async for chunk in upstream.content.iter_any():
                seen += chunk
                await response.write(chunk)
            await response.write_eof()
            recording.usages.append(_usage(bytes(seen)))
            return response

    app = web.Application()
    app.router.add_post("/v1/completions", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    recording.url = f"http://127.0.0.1:{port}"
    try:
        yield recording
    finally:
        await runner.cleanup()
        await session.close()


def _usage(stream: bytes) -> dict[str, Any]:
    """The usage report of a streamed completion ({} when it has none)."""
    for line in stream.splitlines():
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            if isinstance(chunk.get("usage"), dict):
                usage: dict[str, Any] = chunk["usage"]
                return usage
    return {}


async def llama_tokens(
    backend: LlamaBackend,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    generation: bool = True,
) -> list[int]:
    """What llama.cpp itself makes of a chat: its template's render, then its tokenizer."""
    async with httpx.AsyncClient(timeout=10) as client:
        body = {"messages": messages, "tools": tools, "add_generation_prompt": generation}
        prompt = (await client.post(backend.url + "/apply-template", json=body)).json()["prompt"]
        tokens = await client.post(
            backend.url + "/tokenize",
            json={"content": prompt, "add_special": False, "parse_special": True},
        )
    ids: list[int] = tokens.json()["tokens"]
    return ids
