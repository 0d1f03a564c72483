"""Prometheus metrics over the three transports; per-tenant and per-connection limits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import pytest
import websockets
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.codec import EventDecoder, params_to_pb
from bidi_responses.server.app import RunningServer
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerFactory, make_config
from tests.mesh.conftest import bearer, error_info, keyed_config

HA, HB = {"authorization": "Bearer key-a"}, {"authorization": "Bearer key-b"}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


async def test_metrics_cover_the_three_transports(keyed_server: RunningServer) -> None:
    port = keyed_server.http_port
    async with (
        asyncio.timeout(30),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=HA) as http,
        AsyncResponsesClient(f"127.0.0.1:{keyed_server.grpc_port}", api_key="key-a") as client,
    ):
        assert (
            await http.post("/v1/responses", json={"model": "sim-model", "input": "x"})
        ).is_success
        bad = await http.post("/v1/responses", json={"input": "no model"})
        assert bad.status_code == 400
        async with client.connect() as stream:
            first = await stream.create(model="sim-model", input="hi")
            await stream.create(model="sim-model", input="more", previous_response_id=first.id)
            during = _samples((await http.get("/metrics")).text)
            assert _value(during, "bidi_open_streams", transport="grpc") == 1
            assert _value(during, "bidi_open_lanes") == 1
        async with websockets.connect(
            f"ws://127.0.0.1:{port}/v1/responses", additional_headers=HA
        ) as ws:
            await ws.send(orjson.dumps({"type": "response.create", "model": "sim-model",
                                        "input": "w"}).decode())  # fmt: skip
            while orjson.loads(await ws.recv())["type"] != "response.completed":
                pass
        scrape = await http.get("/metrics")
    assert scrape.headers["content-type"].startswith("text/plain")
    s = _samples(scrape.text)
    for transport in ("http", "grpc", "websocket"):
        assert _value(s, "bidi_requests_total", transport=transport, model="sim-model") >= 1
        assert _value(s, "bidi_responses_total", transport=transport, status="completed") >= 1, (
            transport
        )
        assert _value(s, "bidi_turn_latency_seconds_count", transport=transport) >= 1
        assert _value(s, "bidi_ttft_seconds_count", transport=transport) >= 1
    assert _value(s, "bidi_errors_total", transport="http", code="missing_required_parameter") == 1
    assert _value(s, "bidi_cache_hits_total") == 1
    assert _value(s, "bidi_tokens_rendered_total") > 0
    assert _value(s, "bidi_tokens_reused_total") > 0
    assert _value(s, "bidi_open_streams", transport="grpc") == 0
    assert ("bidi_post_queue_depth", ()) in s


async def test_stream_limits_per_tenant_and_per_connection(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = keyed_config(tmp_path)
    config.tenant_limits.max_streams_per_tenant = 2
    config.tenant_limits.max_streams_per_connection = 3
    running = await server_factory(config, http=True)
    async with asyncio.timeout(30):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}")
        stub = pb_grpc.ResponsesServiceStub(channel)  # type: ignore[no-untyped-call]
        decoder = EventDecoder()

        async def refused(key: str) -> grpc.aio.AioRpcError:
            # The server refuses after the client's first message, so the write cannot race
            # the status (grpcio would then report its own INTERNAL).
            call = stub.Connect(metadata=bearer(key))
            await call.write(pb.ConnectRequest(response_create=params_to_pb(
                {"model": "sim-model", "input": "hi"})))  # fmt: skip
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call.read()
            return caught.value

        async def open_stream(key: str) -> Any:
            call = stub.Connect(metadata=bearer(key))
            await call.write(pb.ConnectRequest(response_create=params_to_pb(
                {"model": "sim-model", "input": "hi"})))  # fmt: skip
            while decoder.event(await call.read())["type"] != "response.completed":
                pass
            return call

        held = [await open_stream("key-a"), await open_stream("key-a")]
        error = await refused("key-a")
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_info(error).metadata["limit"] == "max_streams_per_tenant"
        assert "max_streams_per_tenant" in (error.details() or "")
        with pytest.raises(websockets.InvalidStatus) as denied:
            async with websockets.connect(
                f"ws://127.0.0.1:{running.http_port}/v1/responses", additional_headers=HA
            ):
                pass
        assert denied.value.response.status_code == 429
        # Tenant B is unaffected, until this one HTTP/2 connection holds 3 streams.
        held.append(await open_stream("key-b"))
        error = await refused("key-b")
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_info(error).metadata["limit"] == "max_streams_per_connection"
        # A channel of its own (grpcio shares connections between channels by default).
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{running.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
        ) as other:
            other_stub = pb_grpc.ResponsesServiceStub(other)  # type: ignore[no-untyped-call]
            call = other_stub.Connect(metadata=bearer("key-b"))
            await call.write(pb.ConnectRequest(response_create=params_to_pb(
                {"model": "sim-model", "input": "hi"})))  # fmt: skip
            assert decoder.event(await call.read())["type"] == "response.created"
            call.cancel()
        for call in held:
            call.cancel()
        await channel.close()
        async with httpx.AsyncClient() as http:
            scrape = await http.get(f"http://127.0.0.1:{running.http_port}/metrics")
        samples = _samples(scrape.text)
        assert _value(samples, "bidi_limit_rejections_total", limit="max_streams_per_tenant") == 2
        assert (
            _value(samples, "bidi_limit_rejections_total", limit="max_streams_per_connection") == 1
        )


async def test_request_and_token_rates_per_tenant(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = keyed_config(tmp_path)
    config.tenant_limits.requests_per_minute = 3
    running = await server_factory(config, http=True)
    base = f"http://127.0.0.1:{running.http_port}"
    body = {"model": "sim-model", "input": "x"}
    async with asyncio.timeout(30), httpx.AsyncClient(base_url=base) as http:
        for expected_remaining in ("2", "1", "0"):
            ok = await http.post("/v1/responses", json=body, headers=HA)
            assert ok.status_code == 200
            assert ok.headers["x-ratelimit-limit-requests"] == "3"
            assert ok.headers["x-ratelimit-remaining-requests"] == expected_remaining
        limited = await http.post("/v1/responses", json=body, headers=HA)
        assert limited.status_code == 429
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
        assert "requests_per_minute" in limited.json()["error"]["message"]
        assert limited.headers["x-ratelimit-remaining-requests"] == "0"
        assert float(limited.headers["x-ratelimit-reset-requests"].rstrip("s")) > 0
        assert int(limited.headers["retry-after"]) >= 1
        # gRPC, same tenant: RESOURCE_EXHAUSTED naming the limit; tenant B unaffected.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            stub = pb_grpc.ResponsesServiceStub(channel)  # type: ignore[no-untyped-call]
            request = pb.CreateResponseRequest(params=params_to_pb(body))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stub.CreateResponse(request, metadata=bearer("key-a")):
                    pass
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            info = error_info(caught.value)
            assert info.metadata["limit"] == "requests_per_minute"
            assert int(info.metadata["retry_after_s"]) >= 1
        assert (await http.post("/v1/responses", json=body, headers=HB)).status_code == 200

    tokens = keyed_config(tmp_path / "t")
    tokens.tenant_limits.tokens_per_minute = 20
    running = await server_factory(tokens, http=True)
    base = f"http://127.0.0.1:{running.http_port}"
    async with asyncio.timeout(30), httpx.AsyncClient(base_url=base) as http:
        first = await http.post("/v1/responses", json=body, headers=HA)
        assert first.status_code == 200  # spends more than the 20-token budget
        over = await http.post("/v1/responses", json=body, headers=HA)
        assert over.status_code == 429
        assert "tokens_per_minute" in over.json()["error"]["message"]
        assert (await http.post("/v1/responses", json=body, headers=HB)).status_code == 200


async def test_a_burst_of_opens_gets_clear_statuses(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """200 Connect opens at once over two connections with 50 streams allowed on each: every
    stream either works or is refused with RESOURCE_EXHAUSTED; none is reset without a code."""
    config = make_config(tmp_path)
    config.tenant_limits.max_streams_per_connection = 50
    running = await server_factory(config)
    channels = [
        grpc.aio.insecure_channel(
            f"127.0.0.1:{running.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(2)
    ]
    outcomes: dict[str, int] = {}
    calls: list[Any] = []

    async def one(index: int) -> None:
        stub = pb_grpc.ResponsesServiceStub(channels[index % 2])  # type: ignore[no-untyped-call]
        call = stub.Connect()
        calls.append(call)
        outcome = "ended"
        try:
            await call.write(pb.ConnectRequest(response_create=params_to_pb(
                {"model": "sim-model", "input": "hi"})))  # fmt: skip
            async for message in call:
                if message.WhichOneof("event") in ("response_completed", "error"):
                    outcome = str(message.WhichOneof("event"))
                    break
        except grpc.aio.AioRpcError as error:
            outcome = error.code().name
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    async with asyncio.timeout(60):
        await asyncio.gather(*(one(i) for i in range(200)))
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()
    assert outcomes == {"response_completed": 100, "RESOURCE_EXHAUSTED": 100}
