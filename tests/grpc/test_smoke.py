"""First contact: a Connect stream serves a tool loop with the cache."""

from __future__ import annotations

import asyncio

from bidi_responses.client import AsyncResponsesClient

from tests.conftest import SHELL_TOOL


async def test_tool_loop_over_connect(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(30), client.connect() as stream:
        first = await stream.create(model="sim-model", input="list the files", tools=[SHELL_TOOL])
        assert first.status == "completed"
        assert len(first.function_calls) == 1
        second = await stream.create(
            model="sim-model",
            previous_response_id=first.id,
            tools=[SHELL_TOOL],
            input=[first.call_output("a.txt\nb.txt")],
        )
        assert second.status == "completed"
        assert second.usage is not None and second.usage.cached_tokens > 0
