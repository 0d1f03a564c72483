"""gRPC status conventions: non-OK statuses with google.rpc.Status details, and error events
that say which request they answer."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import websockets
from bidi_responses.codec import EventDecoder, params_to_pb
from bidi_responses.server.app import RunningServer
from bidi_responses.v1 import responses_pb2 as pb
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import ServerFactory, make_config, until
from tests.mesh.conftest import bearer, error_info, keyed_config

A = bearer("key-a")


async def _drain(call: Any) -> list[Any]:
    return [message async for message in call]


async def test_stateless_call_ends_with_the_fitting_status(stub: Any) -> None:
    async with asyncio.timeout(20):
        bad = pb.CreateResponseRequest(params=params_to_pb({"model": "", "input": "hi"}))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _drain(stub.CreateResponse(bad, metadata=A))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = error_info(caught.value)
        assert info.reason == "missing_required_parameter" and info.metadata["param"] == "model"
        status = rpc_status.from_call(caught.value)
        assert status is not None
        bad_request = error_details_pb2.BadRequest()
        assert any(d.Unpack(bad_request) for d in status.details)
        assert bad_request.field_violations[0].field == "model"

        missing_parent = pb.CreateResponseRequest(
            params=params_to_pb(
                {"model": "sim-model", "input": "hi", "previous_response_id": "resp_nope"}
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _drain(stub.CreateResponse(missing_parent, metadata=A))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(caught.value).reason == "previous_response_not_found"

        ok = pb.CreateResponseRequest(params=params_to_pb({"model": "sim-model", "input": "hi"}))
        call = stub.CreateResponse(ok, metadata=A)
        await _drain(call)
        assert await call.code() == grpc.StatusCode.OK


async def test_unary_not_found_has_details(stub: Any) -> None:
    async with asyncio.timeout(10):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetResponse(pb.GetResponseRequest(response_id="resp_x"), metadata=A)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(caught.value).reason == "not_found"
        # The plain trailers stay for clients that do not decode details.
        assert dict(caught.value.trailing_metadata() or ())["error-code"] == "not_found"


async def test_error_events_say_which_request_they_answer(stub: Any) -> None:
    async with asyncio.timeout(20):
        call = stub.Connect(metadata=A)
        decoder = EventDecoder()
        await call.write(
            pb.ConnectRequest(
                event_id="evt_1",
                stream_id="lane-1",
                response_create=params_to_pb(
                    {"model": "sim-model", "input": "hi", "previous_response_id": "resp_gone"}
                ),
            )
        )
        event = decoder.event(await call.read())
        assert event["type"] == "error" and event["stream_id"] == "lane-1"
        assert event["error"]["code"] == "previous_response_not_found"
        assert event["error"]["event_id"] == "evt_1"
        assert event["error"]["request_type"] == "response.create"
        assert event["error"]["response_id"] == "resp_gone"
        await call.write(
            pb.ConnectRequest(
                event_id="evt_2", response_append=pb.ResponseAppend(response_id="resp_other")
            )
        )
        event = decoder.event(await call.read())
        assert event["error"]["event_id"] == "evt_2"
        assert event["error"]["request_type"] == "response.append"
        assert event["error"]["response_id"] == "resp_other"
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK  # the client ended it: OK


async def test_connect_ends_unavailable_at_the_age_limit(
    server_factory: ServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(tmp_path)
    config.limits.connection_max_age_s = 0.6
    config.limits.connection_warning_s = 0.3
    running = await server_factory(config)
    async with (
        asyncio.timeout(20),
        grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

        stub = pb_grpc.ResponsesServiceStub(channel)
        call = stub.Connect()
        decoder = EventDecoder()
        seen = []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for message in call:
                seen.append(decoder.event(message))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(caught.value).reason == "connection_age_limit_reached"
        # gRPC codes are named for what happened, not for WebSocket.
        assert [e.get("code") or e["error"]["code"] for e in seen] == [
            "connection_age_limit_approaching",
            "connection_age_limit_reached",
        ]
        # An expected end: the stream's reader, left waiting for the client, logs no ERROR
        # (it logged "AbortError: Locally aborted" with a traceback).
        await until(lambda: running.core.sessions_open == 0)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_keyed_config_helper(tmp_path: Path) -> None:
    assert keyed_config(tmp_path).auth.api_keys["key-a"] == "tenant-a"


async def test_websocket_error_events_echo_the_event_id(keyed_server: RunningServer) -> None:
    async with (
        asyncio.timeout(20),
        websockets.connect(
            f"ws://127.0.0.1:{keyed_server.http_port}/v1/responses",
            additional_headers={"authorization": "Bearer key-a"},
        ) as ws,
    ):
        await ws.send(orjson.dumps({"type": "response.create", "event_id": "evt_ws",
                                    "model": "sim-model", "input": "hi",
                                    "previous_response_id": "resp_gone"}).decode())  # fmt: skip
        event = orjson.loads(await ws.recv())
        assert event["type"] == "error"
        assert event["error"]["event_id"] == "evt_ws"
        assert event["error"]["request_type"] == "response.create"
        # The id is not a create parameter: a good create with one still works.
        await ws.send(orjson.dumps({"type": "response.create", "event_id": "evt_ok",
                                    "model": "sim-model", "input": "hi"}).decode())  # fmt: skip
        while (event := orjson.loads(await ws.recv()))["type"] != "response.completed":
            assert event["type"] != "error", event
