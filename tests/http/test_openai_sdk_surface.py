"""The official openai Python SDK: compact, input_tokens.count, models, responses.parse and
background mode (create, retrieve, cancel, and a streamed response resumed after a
disconnect)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
from bidi_responses.server.app import RunningServer
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel

from tests.conftest import SHELL_TOOL, ServerFactory, background_config

TOOLS: Any = [SHELL_TOOL]


class Step(BaseModel):
    """One step of a plan."""

    title: str
    minutes: int


class Plan(BaseModel):
    """A structured answer: nested objects, lists, enums."""

    goal: str
    priority: Literal["low", "high"]
    steps: list[Step]


async def test_compact_and_continue(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        first = await sdk.responses.create(model="sim-model", input="fix the bug", tools=TOOLS)
        call = first.output[0]
        assert call.type == "function_call"
        second = await sdk.responses.create(
            model="sim-model",
            tools=TOOLS,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}],
        )
        compacted = await sdk.responses.compact(
            model="sim-model", previous_response_id=second.id, safety_identifier="user-42"
        )
        assert compacted.object == "response.compaction"
        # The fields of the current SDK's CompactedResponse, echoed as a create echoes them.
        assert (compacted.safety_identifier, compacted.service_tier) == ("user-42", "default")
        assert [item.type for item in compacted.output] == ["message", "compaction"]
        compaction = compacted.output[-1]
        assert compaction.type == "compaction" and compaction.encrypted_content
        assert compacted.usage.total_tokens > 0

        items: Any = [
            item.model_dump(exclude_none=True, warnings=False) for item in compacted.output
        ]
        follow = await sdk.responses.create(
            model="sim-model", tools=TOOLS, input=[*items, {"role": "user", "content": "go on"}]
        )
        assert follow.status == "completed"
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.responses.compact(model="", input="hi")
        assert caught.value.body is not None


async def test_input_tokens_count_matches_usage(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        counted = await sdk.responses.input_tokens.count(
            model="sim-model", input="list the files", tools=TOOLS, instructions="Be brief."
        )
        assert counted.object == "response.input_tokens"
        created = await sdk.responses.create(
            model="sim-model", input="list the files", tools=TOOLS, instructions="Be brief."
        )
        assert created.usage is not None
        assert counted.input_tokens == created.usage.input_tokens


async def test_models_list_and_retrieve(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        models = [model async for model in sdk.models.list()]
        assert [m.id for m in models] == ["sim-model", "sim-other"]
        assert all(m.object == "model" and m.owned_by == "sim" for m in models)
        model = await sdk.models.retrieve("sim-model")
        assert model.id == "sim-model"
        with pytest.raises(openai.NotFoundError):
            await sdk.models.retrieve("no-such-model")


async def test_responses_parse_returns_a_parsed_object(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        parsed = await sdk.responses.parse(
            model="sim-model", input="plan the release", text_format=Plan
        )
        assert isinstance(parsed.output_parsed, Plan)
        assert parsed.output_parsed.priority in ("low", "high")
        assert parsed.text is not None and parsed.text.format is not None
        assert parsed.text.format.type == "json_schema"
        # The SDK sends strict schemas; they are echoed as sent.
        assert getattr(parsed.text.format, "strict", None) is True
        again = await sdk.responses.retrieve(parsed.id)
        assert Plan.model_validate_json(again.output_text) == parsed.output_parsed


async def test_echoed_parameters(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        response = await sdk.responses.create(
            model="sim-model",
            input="hi",
            truncation="auto",
            reasoning={"effort": "low", "summary": "auto"},
            include=["reasoning.encrypted_content"],
            text={"format": {"type": "json_object"}, "verbosity": "low"},
        )
        assert response.truncation == "auto"
        assert response.reasoning is not None and response.reasoning.effort == "low"
        assert response.text is not None and response.text.format is not None
        assert response.text.format.type == "json_object"
        assert response.text.verbosity == "low"
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.responses.create(model="sim-model", input="hi", top_logprobs=5)
        assert "top_logprobs" in str(caught.value)


@pytest.fixture
async def slow_sdk(
    server_factory: ServerFactory, tmp_path: Path
) -> AsyncIterator[openai.AsyncOpenAI]:
    """The SDK against a server with the background-test routes (``background_config``)."""
    server: RunningServer = await server_factory(background_config(tmp_path), http=True)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="test", max_retries=0
    )
    try:
        yield client
    finally:
        await client.close()


async def _status(sdk: openai.AsyncOpenAI, response_id: str, wanted: set[str]) -> str:
    while True:
        status = (await sdk.responses.retrieve(response_id)).status
        if status in wanted:
            return str(status)
        await asyncio.sleep(0.02)


async def test_background_create_poll_and_cancel(slow_sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        queued = await slow_sdk.responses.create(model="sim-other", input="hi", background=True)
        assert queued.status == "queued" and queued.background is True
        await _status(slow_sdk, queued.id, {"in_progress"})
        cancelled = await slow_sdk.responses.cancel(queued.id)
        assert cancelled.status == "cancelled"
        assert await _status(slow_sdk, queued.id, {"cancelled"}) == "cancelled"


async def test_background_stream_resumed_with_starting_after(slow_sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(30):
        stream = await slow_sdk.responses.create(
            model="sim-model", input="hi", background=True, stream=True
        )
        seen: list[ResponseStreamEvent] = []
        async for event in stream:
            seen.append(event)
            if len(seen) == 6:
                break
        await stream.close()  # the connection drops mid-response
        assert seen[0].type == "response.created"
        response_id = seen[0].response.id
        resumed = await slow_sdk.responses.retrieve(
            response_id, stream=True, starting_after=seen[-1].sequence_number
        )
        rest = [event async for event in resumed]
        numbers = [event.sequence_number for event in seen + rest]
        assert numbers == list(range(len(numbers)))
        final = rest[-1]
        assert final.type == "response.completed"
        text = "".join(
            event.delta for event in seen + rest if event.type == "response.output_text.delta"
        )
        assert text == final.response.output_text
