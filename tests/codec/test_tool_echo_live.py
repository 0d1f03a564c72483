"""Over a live Connect stream, the tools each snapshot echoes come from the lane's ToolSet:
converted to protobuf once for the whole conversation, not once per turn or per response."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.core.api.tools import ToolList
from bidi_responses.v1 import responses_pb2 as pb

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
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
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
