"""Messages the server cannot decode: a status or an error event, a WARNING, never a hang."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.codec import EventDecoder, params_to_pb
from bidi_responses.server.app import RunningServer
from bidi_responses.v1 import responses_pb2 as pb

CONNECT = "/bidi_responses.v1.ResponsesService/Connect"


def _create_bytes(body: dict[str, Any]) -> bytes:
    return pb.ConnectRequest(response_create=params_to_pb(body)).SerializeToString()


def _bad_utf8() -> bytes:
    raw = _create_bytes({"model": "sim-model", "input": "MARKER"})
    return raw.replace(b"MARKER", b"\xff\xfeRKER")


def nested_schema(levels: int) -> dict[str, Any]:
    """A function tool's parameters nested ``levels`` schema levels deep (object/properties)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def nested_value(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"a": value}
    return value


async def _raw_connect(server: RunningServer, messages: list[bytes]) -> list[dict[str, Any]]:
    """Send raw-framed messages on one Connect call, half-close, collect every event."""
    decoder = EventDecoder()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        connect: grpc.aio.StreamStreamMultiCallable[bytes, pb.ConnectResponse] = (
            channel.stream_stream(
                CONNECT,
                request_serializer=None,
                response_deserializer=pb.ConnectResponse.FromString,
            )
        )
        call = connect(iter(messages))
        return [decoder.event(reply) async for reply in call]


async def test_invalid_utf8_on_connect_is_an_error_event_and_the_stream_goes_on(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bidi_responses")
    good = _create_bytes({"model": "sim-model", "input": "hi", "store": False})
    async with asyncio.timeout(20):
        events = await _raw_connect(server, [_bad_utf8(), good])
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1
    assert errors[0]["error"]["code"] == "invalid_message"
    assert "UTF-8" in errors[0]["error"]["message"]
    assert errors[0]["error"]["param"] == "response_create.input.message.content.input_text.text"
    assert events[-1]["type"] == "response.completed"
    assert any(r.levelno == logging.WARNING and "undecodable" in r.message for r in caplog.records)
    assert server.core.sessions_open == 0


async def test_garbage_bytes_on_connect_and_after_half_close(server: RunningServer) -> None:
    async with asyncio.timeout(20):
        events = await _raw_connect(server, [b"\xff\xff\xff\xff", b"\x0a\x05ab"])
    assert [e["error"]["code"] for e in events] == ["invalid_message", "invalid_message"]


async def test_stateless_and_unary_calls_answer_invalid_argument(server: RunningServer) -> None:
    async with (
        asyncio.timeout(20),
        grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel,
    ):
        create: grpc.aio.UnaryStreamMultiCallable[bytes, pb.CreateResponseResponse]
        create = channel.unary_stream(
            "/bidi_responses.v1.ResponsesService/CreateResponse",
            request_serializer=None,
            response_deserializer=pb.CreateResponseResponse.FromString,
        )
        raw = pb.CreateResponseRequest(
            params=params_to_pb({"model": "sim-model", "input": "MARKER"})
        ).SerializeToString()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in create(raw.replace(b"MARKER", b"\xc3\x28RKER")):
                pass
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "UTF-8" in (caught.value.details() or "")
        get: grpc.aio.UnaryUnaryMultiCallable[bytes, pb.GetResponseResponse]
        get = channel.unary_unary(
            "/bidi_responses.v1.ResponsesService/GetResponse",
            request_serializer=None,
            response_deserializer=pb.GetResponseResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await get(b"\x0a\x02\xff\xfe")
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_deep_tool_schemas_pass_on_the_stream_and_back(
    client: AsyncResponsesClient,
) -> None:
    """14 schema levels (29 JSON levels, ~90 protobuf levels) pass on the stream and back."""
    tool = {"type": "function", "name": "deep", "parameters": nested_schema(14)}
    async with asyncio.timeout(20), client.connect() as stream:
        response = await stream.create(model="sim-model", input="hi", tools=[tool], store=False)
        assert response.status == "completed"
        assert response.raw["tools"][0]["parameters"] == tool["parameters"]


@pytest.mark.parametrize(
    ("levels", "code"),
    # 62 levels under input[0].tools[0] pass protobuf (~194 levels) but not the JSON limit;
    # 300 levels are refused while decoding.
    [(62, "nesting_too_deep"), (300, "invalid_message")],
)
async def test_too_deep_struct_is_refused_naming_the_field(
    client: AsyncResponsesClient, levels: int, code: str
) -> None:
    item = {"type": "additional_tools", "role": "developer", "tools": [nested_value(levels)]}
    async with asyncio.timeout(20), client.connect() as stream:
        with pytest.raises(ResponsesError) as caught:
            await stream.create(model="sim-model", input=[item], store=False)
        assert caught.value.code == code
        param = caught.value.param
        assert param is not None and param.startswith(("input[0].tools[0].a", "response_create"))
        assert len(param) < 300
        # The stream still serves.
        ok = await stream.create(model="sim-model", input="hi", store=False)
        assert ok.status == "completed"


async def test_nan_and_infinity_in_a_struct_are_400s(client: AsyncResponsesClient) -> None:
    tool = {"type": "web_search", "weight": float("inf")}
    async with asyncio.timeout(20), client.connect() as stream:
        with pytest.raises(ResponsesError) as caught:
            await stream.create(model="sim-model", input="hi", tools=[tool], store=False)
        assert (caught.value.code, caught.value.param) == ("invalid_value", "tools[0].weight")
    with pytest.raises(ResponsesError) as caught:
        async with asyncio.timeout(20):
            await client.create(
                model="sim-model", input="hi", tools=[{"type": "x", "n": float("nan")}]
            )
    assert caught.value.code == "invalid_value"
