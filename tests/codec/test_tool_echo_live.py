"""Over a live Connect stream, the tools each snapshot echoes come from the lane's ToolSet:
converted to protobuf once for the whole conversation, not once per turn or per response."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import orjson
import pytest
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.codec import JSONObject, params_to_pb
from bidi_responses.server.core.api.tools import ToolList
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from tests.conftest import SHELL_TOOL, ServerFactory

TURNS = 3


async def test_one_protobuf_conversion_for_a_conversations_tools(
    server_factory: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[ToolList] = []
    original = ToolList.protobuf

    def counting(self: ToolList) -> Sequence[pb.Tool]:
        if self._protobuf is None:
            built.append(self)
        return original(self)

    monkeypatch.setattr(ToolList, "protobuf", counting)
    running = await server_factory(tool_rounds=TURNS + 1)
    async with (
        asyncio.timeout(60),
        # The Struct form (the client's default is JSON text, see the test below).
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}", json_tool_schemas=False) as client,
        client.connect() as stream,
    ):
        response = await stream.create(
            model="sim-model", input="Run the tests.", tools=[SHELL_TOOL]
        )
        for turn in range(TURNS):
            call = response.function_calls[0]
            response = await stream.create(
                model="sim-model",
                tools=[SHELL_TOOL],
                previous_response_id=response.id,
                input=[
                    {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
                ],
            )
            assert [tool["name"] for tool in response.raw["tools"]] == [SHELL_TOOL["name"]], turn
    assert len(built) == 1


def _deep_schema(levels: int) -> JSONObject:
    schema: JSONObject = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


# The deepest schema the server accepts (MAX_JSON_DEPTH): the JSON form carries it both ways.
DEEP_TOOL: JSONObject = {"type": "function", "name": "deep", "parameters": _deep_schema(14)}


async def test_the_clients_json_schemas_carry_a_deep_schema_both_ways(
    server_factory: ServerFactory,
) -> None:
    running = await server_factory(tool_rounds=1)
    async with (
        asyncio.timeout(60),
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}", json_tool_schemas=True) as client,
        client.connect() as stream,
    ):
        response = await stream.create(model="sim-model", input="Go.", tools=[DEEP_TOOL])
        assert response.raw["tools"][0]["parameters"] == DEEP_TOOL["parameters"]
        unary = await client.create(model="sim-model", input="Go.", tools=[DEEP_TOOL])
        assert unary.raw["tools"][0]["parameters"] == DEEP_TOOL["parameters"]


async def _stock_turn(port: int, request: pb.ConnectRequest) -> list[pb.ConnectResponse]:
    """One create on a plain stub: protobuf's default parser and depth limit, no options
    besides the request's own."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        call = pb_grpc.ResponsesServiceStub(channel).Connect()
        await call.write(request)
        messages = []
        async for message in call:
            messages.append(message)
            if message.WhichOneof("event") in ("response_completed", "error"):
                break
        call.cancel()
        return messages
    finally:
        await channel.close()


async def test_a_stock_client_that_asks_reads_a_deep_echo_and_json_wins_over_the_struct(
    server_factory: ServerFactory,
) -> None:
    running = await server_factory(tool_rounds=1)
    params = params_to_pb(
        {"model": "sim-model", "input": "Go.", "tools": [DEEP_TOOL]}, json_parameters=True
    )
    # Both forms set: the Struct says something else, and is ignored.
    params.tools[0].function.parameters.update({"type": "object", "properties": {}})
    request = pb.ConnectRequest(
        response_create=params, delivery=pb.DeliveryOptions(tool_parameters_json=True)
    )
    async with asyncio.timeout(60):
        messages = await _stock_turn(running.grpc_port, request)
    completed = messages[-1].response_completed.response
    function = completed.tools[0].function
    assert not function.HasField("parameters")
    assert orjson.loads(function.parameters_json) == DEEP_TOOL["parameters"]


async def test_parameters_json_that_is_not_json_is_refused_naming_the_field(
    server_factory: ServerFactory,
) -> None:
    running = await server_factory()
    params = params_to_pb({"model": "sim-model", "input": "Go.", "tools": [SHELL_TOOL]})
    params.tools[0].function.parameters_json = b'{"type": "object",'
    async with asyncio.timeout(60):
        messages = await _stock_turn(running.grpc_port, pb.ConnectRequest(response_create=params))
    error = messages[-1].error
    assert error.status == 400
    assert error.error.param == "tools[0].parameters"
