"""The official openai SDK against the HTTP+SSE surface."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from tests.conftest import SHELL_TOOL_PARAM


async def test_create_retrieve_delete(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        response = await sdk.responses.create(model="sim-model", input="say hi")
        assert response.status == "completed"
        assert response.output_text
        assert response.usage is not None and response.usage.total_tokens > 0

        again = await sdk.responses.retrieve(response.id)
        assert again.id == response.id
        assert again.output_text == response.output_text

        await sdk.responses.delete(response.id)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(response.id)


async def test_streaming_create(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        stream = await sdk.responses.create(model="sim-model", input="say hi", stream=True)
        events = [event async for event in stream]
        kinds = [event.type for event in events]
        assert kinds[0] == "response.created"
        assert kinds[-1] == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        final = events[-1]
        assert final.type == "response.completed"
        assert final.response.output_text == text


async def test_strict_stream_helper_accepts_the_event_order(sdk: openai.AsyncOpenAI) -> None:
    # responses.stream() raises on any ordering slip (a delta before its item, a repeated
    # output_index, no response.completed), so it checks the whole event sequence.
    async with asyncio.timeout(20):
        async with sdk.responses.stream(
            model="sim-model", input="list files", tools=[SHELL_TOOL_PARAM]
        ) as stream:
            async for _ in stream:
                pass
            final = await stream.get_final_response()
        assert final.status == "completed"
        assert final.output[0].type == "function_call"


async def test_tool_loop_with_previous_response_id(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(30):
        tools = [SHELL_TOOL_PARAM]
        response = await sdk.responses.create(model="sim-model", input="fix the bug", tools=tools)
        turns = 1
        while True:
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                break
            outputs: Any = [
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": f"ran {call.name}",
                }
                for call in calls
            ]
            response = await sdk.responses.create(
                model="sim-model", tools=tools, previous_response_id=response.id, input=outputs
            )
            turns += 1
        # The fast sim calls a tool for three turns, then answers.
        assert turns == 4
        assert response.status == "completed"
        assert response.output_text


async def test_input_items_auto_pagination(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        texts = [f"note {i}" for i in range(5)]
        response = await sdk.responses.create(
            model="sim-model", input=[{"role": "user", "content": t} for t in texts]
        )
        seen = []
        # limit=2 makes the SDK follow the cursor (after=<last id>) across three pages.
        async for item in sdk.responses.input_items.list(response.id, limit=2):
            assert item.type == "message"
            seen.append(item.content[0].text)  # type: ignore[union-attr]
        assert seen == texts[::-1]


async def test_errors_map_to_sdk_exceptions(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as caught:
                await sdk.responses.create(
                    model="sim-model",
                    input="hi",
                    stream=stream,
                    previous_response_id="resp_unknown",
                )
            assert caught.value.code == "previous_response_not_found"
            assert caught.value.param == "previous_response_id"
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.responses.create(model="", input="hi")
        assert caught.value.param == "model"
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.delete("resp_unknown")
