"""Optional OpenTelemetry tracing: a server span per gRPC call, HTTP request and WebSocket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson
import pytest
import websockets
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import ServerFactory, make_config

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _provider() -> None:
    # The global provider can be set once per process; later calls are ignored with a warning.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)


async def test_each_transport_gets_server_spans(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    _EXPORTER.clear()
    config = make_config(tmp_path)
    config.tracing = True
    running = await server_factory(config, http=True)
    async with asyncio.timeout(30):
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client:
            async with client.connect() as stream:
                await stream.create(model="sim-model", input="hi")
            # The interceptor keeps the call's own status and details.
            with pytest.raises(ResponsesError) as caught:
                await client.create(model="", input="hi")
            assert caught.value.code == "missing_required_parameter"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.http_port}") as http:
            reply = await http.post("/v1/responses", json={"model": "sim-model", "input": "x"})
            assert reply.status_code == 200
        async with websockets.connect(f"ws://127.0.0.1:{running.http_port}/v1/responses") as ws:
            await ws.send(orjson.dumps({"type": "response.create", "model": "sim-model",
                                        "input": "w"}).decode())  # fmt: skip
            while orjson.loads(await ws.recv())["type"] != "response.completed":
                pass
    await running.stop(grace=0)
    spans = [(s.name, s.kind) for s in _EXPORTER.get_finished_spans()]
    names = {name for name, _ in spans}
    assert "/bidi_responses.v1.ResponsesService/Connect" in names, names
    assert "POST /v1/responses" in names, names
    assert "HTTP /v1/responses" in names, names  # the WebSocket connection
    assert all(kind == trace.SpanKind.SERVER for _, kind in spans)
