"""API keys and tenant isolation: a cross-tenant table over every transport."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import httpx
import orjson
import pytest
import websockets
from bidi_responses.codec import EventDecoder, params_to_pb
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.storage.sqlite_schema import read_ledger
from bidi_responses.v1 import responses_pb2 as pb

from tests.mesh.conftest import bearer, error_info

A, B = bearer("key-a"), bearer("key-b")
HA, HB = {"authorization": "Bearer key-a"}, {"authorization": "Bearer key-b"}


def _http(server: RunningServer, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{server.http_port}", headers=headers, timeout=10
    )


async def _drain(call: Any) -> list[Any]:
    return [message async for message in call]


async def test_missing_or_wrong_key_is_refused_and_never_logged(
    keyed_server: RunningServer, stub: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "sk-wrong-secret-value"
    async with asyncio.timeout(20):
        for metadata in (None, bearer(secret), (("authorization", "Basic abc"),)):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _drain(stub.Connect(iter(()), metadata=metadata))
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_info(caught.value).reason == "invalid_api_key"
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetResponse(pb.GetResponseRequest(response_id="r"), metadata=metadata)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                request = pb.CreateResponseRequest(params=params_to_pb({"model": "sim-model"}))
                await _drain(stub.CreateResponse(request, metadata=metadata))
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for headers in ({}, {"authorization": f"Bearer {secret}"}):
            async with _http(keyed_server, headers) as http:
                reply = await http.post("/v1/responses", json={"model": "sim-model", "input": "x"})
                assert reply.status_code == 401
                assert reply.json()["error"]["code"] == "invalid_api_key"
                assert secret not in reply.text
                assert (await http.get("/v1/responses/resp_x")).status_code == 401
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with websockets.connect(
                    f"ws://127.0.0.1:{keyed_server.http_port}/v1/responses",
                    additional_headers=headers,
                ):
                    pass
            assert refused.value.response.status_code == 401
    # The server's own log lines (the client libraries here log their own headers at DEBUG).
    server_lines = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(("bidi_responses", "uvicorn", "grpc"))
    ]
    assert not any(secret in line for line in server_lines)
    assert not any("handshake" in line for line in server_lines)


async def _ws_create(port: int, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    async with websockets.connect(
        f"ws://127.0.0.1:{port}/v1/responses", additional_headers=headers
    ) as ws:
        await ws.send(orjson.dumps({"type": "response.create", **body}).decode())
        while True:
            event = orjson.loads(await ws.recv())
            if event["type"] in ("error", "response.completed", "response.incomplete"):
                result: dict[str, Any] = event
                return result


async def _connect_create(stub: Any, metadata: Any, **body: Any) -> dict[str, Any]:
    call = stub.Connect(metadata=metadata)
    decoder = EventDecoder()
    await call.write(pb.ConnectRequest(response_create=params_to_pb(body)))
    try:
        async for message in call:
            event = decoder.event(message)
            if event["type"] in ("error", "response.completed", "response.incomplete"):
                return event
    finally:
        call.cancel()
    raise AssertionError("no terminal event")


async def test_cross_tenant_table(keyed_server: RunningServer, stub: Any) -> None:
    """Each operation on tenant A's ids, by tenant B over each transport: not found."""
    port = keyed_server.http_port
    assert port is not None
    async with asyncio.timeout(60), _http(keyed_server, HA) as a, _http(keyed_server, HB) as b:
        # A's stored response (over HTTP) and A's response known only to A's stream cache.
        stored = (await a.post("/v1/responses", json={"model": "sim-model", "input": "a1"})).json()
        cached_event = await _connect_create(stub, A, model="sim-model", input="a2", store=False)
        cached = cached_event["response"]
        results: dict[tuple[str, str, str], bool] = {}

        async def grpc_not_found(coro: Any) -> bool:
            try:
                await coro
            except grpc.aio.AioRpcError as error:
                return error.code() == grpc.StatusCode.NOT_FOUND
            return False

        for kind, rid in (("stored", stored["id"]), ("cached", cached["id"])):
            results[("get", "http", kind)] = (
                await b.get(f"/v1/responses/{rid}")
            ).status_code == 404
            results[("get", "grpc", kind)] = await grpc_not_found(
                stub.GetResponse(pb.GetResponseRequest(response_id=rid), metadata=B)
            )
            results[("input_items", "http", kind)] = (
                await b.get(f"/v1/responses/{rid}/input_items")
            ).status_code == 404
            results[("input_items", "grpc", kind)] = await grpc_not_found(
                stub.ListInputItems(pb.ListInputItemsRequest(response_id=rid), metadata=B)
            )
            results[("delete", "http", kind)] = (
                await b.delete(f"/v1/responses/{rid}")
            ).status_code == 404
            results[("delete", "grpc", kind)] = await grpc_not_found(
                stub.DeleteResponse(pb.DeleteResponseRequest(response_id=rid), metadata=B)
            )
            results[("cancel", "http", kind)] = (
                await b.post(f"/v1/responses/{rid}/cancel")
            ).status_code == 404
            results[("cancel", "grpc", kind)] = await grpc_not_found(
                stub.CancelResponse(pb.CancelResponseRequest(response_id=rid), metadata=B)
            )
            body = {"model": "sim-model", "input": "b", "previous_response_id": rid}
            reply = await b.post("/v1/responses", json=body)
            results[("previous_response_id", "http", kind)] = (
                reply.status_code == 400
                and reply.json()["error"]["code"] == "previous_response_not_found"
            )
            results[("previous_response_id", "grpc-unary", kind)] = await grpc_not_found(
                _drain(
                    stub.CreateResponse(
                        pb.CreateResponseRequest(params=params_to_pb(body)), metadata=B
                    )
                )
            )
            event = await _connect_create(stub, B, **body)
            results[("previous_response_id", "grpc-connect", kind)] = (
                event["type"] == "error" and event["error"]["code"] == "previous_response_not_found"
            )
            event = await _ws_create(port, HB, **body)
            results[("previous_response_id", "websocket", kind)] = (
                event["type"] == "error" and event["error"]["code"] == "previous_response_not_found"
            )
            # Compaction and token counts read the stored chain too.
            compact = {"model": "sim-model", "input": [], "previous_response_id": rid}
            reply = await b.post("/v1/responses/compact", json=compact)
            results[("compact", "http", kind)] = (
                reply.status_code == 400
                and reply.json()["error"]["code"] == "previous_response_not_found"
            )
            results[("compact", "grpc", kind)] = await grpc_not_found(
                stub.CompactResponse(
                    pb.CompactResponseRequest(model="sim-model", previous_response_id=rid),
                    metadata=B,
                )
            )
            reply = await b.post("/v1/responses/input_tokens", json=body)
            results[("input_tokens", "http", kind)] = (
                reply.status_code == 400
                and reply.json()["error"]["code"] == "previous_response_not_found"
            )
            results[("input_tokens", "grpc", kind)] = await grpc_not_found(
                stub.CountInputTokens(
                    pb.CountInputTokensRequest(params=params_to_pb(body)), metadata=B
                )
            )
        # In flight: B can neither see nor cancel A's running response.
        call = stub.Connect(metadata=A)
        decoder = EventDecoder()
        slow = {"model": "sim-model", "input": "a3", "append_mode": True, "tools": [_TOOL]}
        await call.write(pb.ConnectRequest(response_create=params_to_pb(slow)))
        created = decoder.event(await call.read())
        assert created["type"] == "response.created"
        rid = created["response"]["id"]
        results[("get", "http", "in_flight")] = (
            await b.get(f"/v1/responses/{rid}")
        ).status_code == 404
        results[("cancel", "http", "in_flight")] = (
            await b.post(f"/v1/responses/{rid}/cancel")
        ).status_code == 404
        results[("cancel", "grpc", "in_flight")] = await grpc_not_found(
            stub.CancelResponse(pb.CancelResponseRequest(response_id=rid), metadata=B)
        )
        assert (await a.get(f"/v1/responses/{rid}")).status_code == 200  # A sees it
        call.cancel()

        # A background response: B can neither read its events again nor see it.
        queued = await a.post(
            "/v1/responses", json={"model": "sim-model", "input": "bg", "background": True}
        )
        assert queued.status_code == 200, queued.text
        bg = queued.json()["id"]
        results[("stream_again", "http", "background")] = (
            await b.get(f"/v1/responses/{bg}", params={"stream": "true"})
        ).status_code == 400  # "not a background response" for B, like any other id
        results[("stream_again", "grpc", "background")] = await grpc_not_found(
            _drain(stub.StreamResponse(pb.StreamResponseRequest(response_id=bg), metadata=B))
        )
        results[("get", "http", "background")] = (
            await b.get(f"/v1/responses/{bg}")
        ).status_code == 404
        assert (await a.get(f"/v1/responses/{bg}", params={"stream": "true"})).status_code == 200

        failed = sorted(key for key, ok in results.items() if not ok)
        assert not failed, f"not isolated: {failed}"
        assert len(results) == 2 * 16 + 3 + 3
        # A still owns everything B tried to delete.
        assert (await a.get(f"/v1/responses/{stored['id']}")).status_code == 200


_TOOL = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


async def test_ledger_records_the_authenticated_tenant(keyed_server: RunningServer) -> None:
    async with asyncio.timeout(20), _http(keyed_server, HA) as a:
        reply = await a.post(
            "/v1/responses", json={"model": "sim-model", "input": "x", "user": "tenant-b"}
        )
        assert reply.status_code == 200
        rid = reply.json()["id"]
    await keyed_server.core.deps.post.drain()
    rows = {row.response_id: row for row in read_ledger(keyed_server.core.config.store_path)}
    assert rows[rid].tenant == "tenant-a"  # the body's user is only a label
