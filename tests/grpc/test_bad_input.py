"""Bad input gets a clear error naming the field, and the stream stays usable."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.codec import params_to_pb
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from tests.conftest import SHELL_TOOL, ServerFactory, collect_until_terminal, make_config

BAD_REQUESTS: list[tuple[str, dict[str, Any], str, str]] = [
    ("empty model", {"model": "", "input": "hi"}, "missing_required_parameter", "model"),
    ("unknown model", {"model": "gpt-nope", "input": "hi"}, "model_not_found", "model"),
    (
        "unknown previous id",
        {"model": "sim-model", "input": "hi", "previous_response_id": "resp_missing"},
        "previous_response_not_found",
        "previous_response_id",
    ),
    (
        "output without call",
        {
            "model": "sim-model",
            "input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}],
        },
        "invalid_value",
        "input[0].call_id",
    ),
    (
        "bad role",
        {"model": "sim-model", "input": [{"type": "message", "role": "robot", "content": "hi"}]},
        "invalid_value",
        "input[0].role",
    ),
    (
        "schema type",
        {
            "model": "sim-model",
            "input": "hi",
            "tools": [
                {
                    "type": "function",
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"x": {"type": "strng"}}},
                }
            ],
        },
        "invalid_function_parameters",
        "tools[0].parameters.properties.x.type",
    ),
    (
        "schema not object",
        {
            "model": "sim-model",
            "input": "hi",
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}],
        },
        "invalid_function_parameters",
        "tools[0].parameters.type",
    ),
    (
        "required undefined",
        {
            "model": "sim-model",
            "input": "hi",
            "tools": [
                {
                    "type": "function",
                    "name": "f",
                    "parameters": {"type": "object", "properties": {}, "required": ["x"]},
                }
            ],
        },
        "invalid_function_parameters",
        "tools[0].parameters.required",
    ),
    (
        "bad tool name",
        {
            "model": "sim-model",
            "input": "hi",
            "tools": [{"type": "function", "name": "has space", "parameters": {"type": "object"}}],
        },
        "invalid_value",
        "tools[0].name",
    ),
    (
        "duplicate tool",
        {"model": "sim-model", "input": "hi", "tools": [SHELL_TOOL, SHELL_TOOL]},
        "invalid_value",
        "tools[1].name",
    ),
    (
        "undeclared call",
        {
            "model": "sim-model",
            "tools": [SHELL_TOOL],
            "input": [
                {"type": "function_call", "call_id": "c1", "name": "rm_rf", "arguments": "{}"}
            ],
        },
        "invalid_value",
        "input[0].name",
    ),
    (
        "temperature",
        {"model": "sim-model", "input": "hi", "temperature": 3.5},
        "invalid_value",
        "temperature",
    ),
    (
        "max_output_tokens",
        {"model": "sim-model", "input": "hi", "max_output_tokens": 3},
        "invalid_value",
        "max_output_tokens",
    ),
    (
        "forced unknown tool",
        {
            "model": "sim-model",
            "input": "hi",
            "tools": [SHELL_TOOL],
            "tool_choice": {"type": "function", "name": "nope"},
        },
        "invalid_value",
        "tool_choice.name",
    ),
    (
        "oversize item",
        {"model": "sim-model", "input": "x" * 5000},
        "string_above_max_length",
        "input[0].content[0].text",
    ),
    (
        "oversize request",
        {
            "model": "sim-model",
            "input": [{"type": "message", "role": "user", "content": "y" * 3000} for _ in range(5)],
        },
        "input_too_large",
        "input",
    ),
]


@pytest.mark.parametrize(
    ("body", "code", "param"), [r[1:] for r in BAD_REQUESTS], ids=[r[0] for r in BAD_REQUESTS]
)
async def test_bad_create_is_an_error_event_and_the_stream_goes_on(
    server_factory: ServerFactory, tmp_path: Any, body: dict[str, Any], code: str, param: str
) -> None:
    config = make_config(tmp_path)
    config.limits.max_item_chars = 4000
    config.limits.max_request_chars = 10_000
    running = await server_factory(config)
    async with (
        asyncio.timeout(20),
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
        client.connect() as stream,
    ):
        with pytest.raises(ResponsesError) as caught:
            await stream.create(**body)
        assert (caught.value.code, caught.value.param) == (code, param)
        # The message names the field, except where the hosted API's wording names the value.
        if code not in ("previous_response_not_found", "model_not_found"):
            assert param.split("[")[0].split(".")[0] in caught.value.message
        assert (await stream.create(model="sim-model", input="ok")).status == "completed"
        # The same request is rejected the same way by the stateless call.
        with pytest.raises(ResponsesError) as stateless:
            await client.create(**body)
        assert stateless.value.code == code


async def test_unknown_model_lists_the_known_ones(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        with pytest.raises(ResponsesError) as caught:
            await stream.create(model="gpt-nope", input="hi")
        assert "sim-model" in caught.value.message and "sim-other" in caught.value.message


async def test_empty_client_event_is_rejected(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        await stream.send(pb.ConnectRequest())
        events = await collect_until_terminal(stream.events())
        assert events[-1]["error"]["param"] == "type"
        await stream.send(
            pb.ConnectRequest(
                response_create=pb.ResponseCreateParams(model="sim-model", input=[pb.Item()])
            )
        )
        events = await collect_until_terminal(stream.events())
        assert events[-1]["error"]["param"] == "input[0].type"
        assert (await stream.create(model="sim-model", input="ok")).status == "completed"


async def test_cancel_with_nothing_in_flight(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        await stream.cancel("resp_nothing")
        events = await collect_until_terminal(stream.events())
        assert events[-1]["error"]["code"] == "response_not_found"


async def test_oversize_message_fails_that_stream_only(
    server_factory: ServerFactory, tmp_path: Any
) -> None:
    config = make_config(tmp_path)
    config.limits.max_message_bytes = 64 * 1024
    running = await server_factory(config)
    async with asyncio.timeout(20):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}")
        stub = pb_grpc.ResponsesServiceStub(channel)
        call = stub.Connect()
        await call.write(
            pb.ConnectRequest(
                response_create=params_to_pb({"model": "sim-model", "input": "z" * 100_000})
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await channel.close()
        async with (
            AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
            client.connect() as stream,
        ):
            assert (await stream.create(model="sim-model", input="ok")).status == "completed"


async def test_stateless_create_rejects_bad_input_with_status(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20):
        with pytest.raises(ResponsesError) as caught:
            await client.get("resp_missing")
        assert caught.value.code == "not_found"
