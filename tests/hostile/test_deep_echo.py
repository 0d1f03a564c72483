"""Deep schemas and a stock gRPC client: whatever the server accepts, every reply that echoes
it decodes with the generated code alone (protobuf's 100-level parse limit); one level
deeper is refused, naming the field.

A schema 20 levels deep used to be accepted, and then every snapshot of its response failed
in a stock grpcio client with "Exception deserializing response!".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
from bidi_responses.codec import deep_messages, params_to_pb
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.api.jsonshape import MAX_JSON_DEPTH
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from tests.hostile.test_grpc_decode import nested_schema, nested_value

# The deepest object a create may hold is at level MAX_JSON_DEPTH - 1 (the body is level 0).
DEEPEST = MAX_JSON_DEPTH - 1
BATCH = pb.DeliveryOptions(batch_events=True)


def _bodies(deepest: int) -> dict[str, dict[str, Any]]:
    """Every place a create's free JSON is echoed from, its deepest object (one holding a
    scalar, the costliest in protobuf) at level ``deepest``."""
    base = {"model": "sim-model", "input": "hi", "store": True}

    def schema(level: int) -> dict[str, Any]:
        """A schema at ``level`` with an annotation reaching ``deepest``."""
        return {"type": "object", "properties": {}, "x-note": nested_value(deepest - level)}

    hosted = {"type": "web_search", "x": nested_value(deepest - 2)}
    passed = {"type": "web_search", "x": nested_value(deepest - 4)}
    # Real schemas: object/properties levels, 14 of them within the limit.
    levels = (deepest - 3) // 2
    return {
        "schema levels": {
            **base,
            "tools": [{"type": "function", "name": "f", "parameters": nested_schema(levels)}],
        },
        "function parameters": {
            **base,
            "tools": [{"type": "function", "name": "f", "parameters": schema(3)}],
        },
        "hosted tool": {**base, "tools": [hosted]},
        "output schema": {
            **base,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema(3)}},
        },
        "pass-through item": {
            **base,
            "input": [
                {"type": "additional_tools", "tools": [passed]},
                {"role": "user", "content": "hi"},
            ],
        },
    }


@pytest.fixture
async def stub(http_server: RunningServer) -> AsyncIterator[pb_grpc.ResponsesServiceAsyncStub]:
    """A stock grpcio stub: replies decoded by the generated code, default parse limits."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{http_server.grpc_port}") as channel:
        yield pb_grpc.ResponsesServiceStub(channel)


def _create_request(body: dict[str, Any], batch: bool = False) -> pb.CreateResponseRequest:
    with deep_messages():  # building a deep request is the client's side, not what is tested
        return pb.CreateResponseRequest(
            params=params_to_pb(body), delivery=BATCH if batch else None
        )


async def _connect(
    stub: pb_grpc.ResponsesServiceAsyncStub, body: dict[str, Any], batch: bool
) -> list[pb.ConnectResponse]:
    with deep_messages():
        request = pb.ConnectRequest(
            response_create=params_to_pb(body), delivery=BATCH if batch else None
        )
    call = stub.Connect(iter([request]))
    return [message async for message in call]


def _cases(message: pb.ConnectResponse) -> list[str]:
    if message.WhichOneof("event") == "batch":
        return [m.WhichOneof("event") or "" for m in message.batch.events]
    return [message.WhichOneof("event") or ""]


@pytest.mark.parametrize("where", list(_bodies(DEEPEST)))
async def test_the_deepest_accepted_request_is_echoed_decodably(
    stub: pb_grpc.ResponsesServiceAsyncStub, http_server: RunningServer, where: str
) -> None:
    body = _bodies(DEEPEST)[where]
    async with asyncio.timeout(30):
        for batch in (False, True):
            messages = await _connect(stub, body, batch)
            cases = [case for message in messages for case in _cases(message)]
            assert cases[0] == "response_created" and cases[-1] == "response_completed", cases
        replies = [reply async for reply in stub.CreateResponse(_create_request(body, True))]
        final = replies[-1].event
        if final.WhichOneof("event") == "batch":
            final = final.batch.events[-1]
        assert final.WhichOneof("event") == "response_completed"
        response_id = final.response_completed.response.id
        stored = await stub.GetResponse(pb.GetResponseRequest(response_id=response_id))
        assert stored.response.id == response_id
        items = await stub.ListInputItems(pb.ListInputItemsRequest(response_id=response_id))
        assert items.data
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{http_server.http_port}"
        ) as http:  # a background response's events, resumed over gRPC
            queued = (await http.post("/v1/responses", json={**body, "background": True})).json()
        events = stub.StreamResponse(pb.StreamResponseRequest(response_id=queued["id"]))
        kinds = [event.event.WhichOneof("event") async for event in events]
        assert kinds[-1] == "response_completed", kinds


@pytest.mark.parametrize("where", list(_bodies(DEEPEST + 1)))
async def test_one_level_deeper_is_refused_naming_the_field(
    stub: pb_grpc.ResponsesServiceAsyncStub, http_server: RunningServer, where: str
) -> None:
    body = _bodies(DEEPEST + 1)[where]
    prefix = {
        "schema levels": "tools[0].parameters.properties.x",
        "function parameters": "tools[0].parameters.x-note.a",
        "hosted tool": "tools[0].x.a",
        "output schema": "text.format.schema.x-note.a",
        "pass-through item": "input[0].tools[0].x.a",
    }[where]
    async with asyncio.timeout(30):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.CreateResponse(_create_request(body)):
                pass
        error = caught.value
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        param = str(dict(error.trailing_metadata() or ())["error-param"])
        assert param.startswith(prefix), param
        assert f"at most {MAX_JSON_DEPTH} levels" in (error.details() or "")
        # The Connect stream answers with an error event and goes on.
        messages = await _connect(stub, body, batch=False)
        assert messages[0].WhichOneof("event") == "error"
        assert messages[0].error.error.code == "nesting_too_deep"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_server.http_port}") as http:
            reply = await http.post("/v1/responses", json=body)
            assert reply.status_code == 400
            assert reply.json()["error"]["param"].startswith(prefix)
