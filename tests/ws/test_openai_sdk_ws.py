"""The official openai SDK in WebSocket mode: ``client.responses.connect()``."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import orjson
from openai.lib.responses_websocket import (
    AsyncResponsesWebSocketSession,
    ResponsesWebSocketLimits,
)

from tests.conftest import SHELL_TOOL

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
TOOLS: Any = [SHELL_TOOL]
LIMITS = ResponsesWebSocketLimits(
    max_lanes=8,
    max_events_per_lane=256,
    max_events=1024,
    max_bytes_per_lane=16 << 20,
    max_bytes=32 << 20,
)


async def next_turn(conn: Any) -> list[Any]:
    """Events of one turn, up to its terminal or error event."""
    events = []
    async for event in conn:
        events.append(event)
        if event.type in TERMINAL or event.type == "error":
            break
    return events


async def test_tool_loop_over_the_socket(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(30), sdk.responses.connect() as conn:
        # Codex's first frame: a generate:false warm-up with the base instructions and tools.
        await conn.response.create(
            model="sim-model",
            generate=False,
            tools=TOOLS,
            stream=True,
            input=[{"role": "developer", "content": "base prompt"}],
        )
        warm = await next_turn(conn)
        assert [e.type for e in warm] == ["response.created", "response.completed"]
        previous = warm[-1].response
        assert previous.output == []

        await conn.response.create(
            model="sim-model",
            tools=TOOLS,
            stream=True,
            previous_response_id=previous.id,
            input="fix the bug",
        )
        turns = 0
        while True:
            events = await next_turn(conn)
            response = events[-1].response
            assert events[-1].type == "response.completed"
            assert response.previous_response_id == previous.id
            # Every turn after the warm-up reuses the connection's cached state.
            assert response.usage.input_tokens_details.cached_tokens > 0
            turns += 1
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                break
            # Only the new items go over the socket: the server has the call from its cache.
            await conn.response.create(
                model="sim-model",
                tools=TOOLS,
                stream=True,
                previous_response_id=response.id,
                input=[
                    {"type": "function_call_output", "call_id": c.call_id, "output": "ok"}
                    for c in calls
                ],
            )
            previous = response
        assert turns == 4
        assert response.output_text


async def test_error_events_do_not_end_the_connection(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20), sdk.responses.connect() as conn:
        await conn.response.create(
            model="sim-model", input="hi", previous_response_id="resp_unknown"
        )
        (error,) = await next_turn(conn)
        assert error.type == "error"
        assert error.error.code == "previous_response_not_found"
        assert error.error.param == "previous_response_id"

        await conn.response.create(model="sim-model", input="hi", background=True)
        (error,) = await next_turn(conn)
        assert error.error.param == "background"

        await conn.response.create(model="sim-model", input="hi")
        assert (await next_turn(conn))[-1].type == "response.completed"


async def test_lanes_with_the_sdk_session_helper(sdk: openai.AsyncOpenAI) -> None:
    async with (
        asyncio.timeout(20),
        sdk.responses.connect() as conn,
        AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session,
    ):
        lanes = {name: session.lane(name) for name in ("agent-1", "agent-2")}
        for lane in lanes.values():
            await lane.send(
                {"type": "response.create", "model": "sim-model", "input": "ls", "tools": TOOLS}
            )
        firsts = await asyncio.gather(*(lane.get_final_response() for lane in lanes.values()))
        assert all(r.status == "completed" for r in firsts)
        for lane, first in zip(lanes.values(), firsts, strict=True):
            call = first.output[0]
            assert call.type == "function_call"
            await lane.send(
                {
                    "type": "response.create",
                    "model": "sim-model",
                    "tools": TOOLS,
                    "previous_response_id": first.id,
                    "input": [
                        {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}
                    ],
                }
            )
        seconds = await asyncio.gather(*(lane.get_final_response() for lane in lanes.values()))
        for first, second in zip(firsts, seconds, strict=True):
            assert second.previous_response_id == first.id
            assert second.usage is not None
            assert second.usage.input_tokens_details.cached_tokens > 0


async def test_append_mode_through_the_sdk_connection(sdk: openai.AsyncOpenAI) -> None:
    # response.append is this server's prototype shape; the SDK's send() carries any JSON.
    async with asyncio.timeout(20), sdk.responses.connect() as conn:
        await conn.send(
            {
                "type": "response.create",
                "model": "sim-model",
                "input": "fix it",
                "tools": TOOLS,
                "append_mode": True,
            }
        )  # type: ignore[typeddict-unknown-key]
        pauses = 0
        while True:
            # response.done is not an SDK event type; read these frames as plain JSON.
            event = orjson.loads(await conn.recv_bytes())
            while event["type"] not in TERMINAL | {"error", "response.done"}:
                event = orjson.loads(await conn.recv_bytes())
            if event["type"] != "response.done":
                break
            pauses += 1
            await conn.send(
                {  # type: ignore[misc]
                    "type": "response.append",
                    "response_id": event["response"]["id"],
                    "input": [
                        {"type": "function_call_output", "call_id": c["call_id"], "output": "ok"}
                        for c in event["pending_calls"]
                    ],
                }
            )
        assert event["type"] == "response.completed"
        assert pauses == 3


async def test_a_compacted_history_continues_over_the_socket(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(30):
        compacted = await sdk.responses.compact(
            model="sim-model",
            input=[
                {"role": "user", "content": "summarize the build log"},
                {"role": "assistant", "content": "Step 3 failed: missing header."},
            ],
        )
        items: Any = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
        async with sdk.responses.connect() as conn:
            await conn.response.create(
                model="sim-model", input=[*items, {"role": "user", "content": "fix it"}]
            )
            first = (await next_turn(conn))[-1]
            assert first.type == "response.completed"
            await conn.response.create(
                model="sim-model", previous_response_id=first.response.id, input="and then?"
            )
            second = (await next_turn(conn))[-1]
            assert second.type == "response.completed"
            # The continuation reused the cached render, compaction summary included.
            usage = second.response.usage
            assert usage is not None
            assert usage.input_tokens_details.cached_tokens >= first.response.usage.input_tokens
