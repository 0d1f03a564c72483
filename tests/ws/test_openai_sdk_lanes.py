"""The official openai SDK (3.57) in WebSocket mode: queued lanes, forks, the lane limit and
steering, as ``client.responses.connect()`` and its lane helper drive them.

Steering runs on script routes paced slowly enough (tens of tokens per second) that a steer
sent on an item's first event reaches the server long before that item ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from bidi_responses.server.app import RunningServer
from bidi_responses.server.config import RouteConfig
from openai.lib.responses_websocket import AsyncResponsesWebSocketSession

from tests.conftest import FAST_SIM, SHELL_TOOL, ServerFactory, make_config
from tests.ws.test_openai_sdk_ws import LIMITS, next_turn

pytestmark = pytest.mark.timeout(60)

TOOLS: Any = [SHELL_TOOL]
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
LONG_TEXT = "Reading the file and checking its indentation, line by line, " * 3
# Steered while its message streams: the call after it never starts.
STEER_SCRIPT = [
    {
        "output": [
            {"type": "message", "text": LONG_TEXT},
            {"type": "function_call", "name": SHELL_TOOL["name"]},
        ]
    },
    {"output": [{"type": "message", "text": "Switching to tabs."}]},
]
# Steered while its function call streams: it ends with that call, for the client to run.
PENDING_SCRIPT = [
    {
        "output": [
            {
                "type": "function_call",
                "name": SHELL_TOOL["name"],
                "arguments": {"cmd": "grep -rn 'indent' " + "src/ " * 40},
            }
        ]
    },
    {"output": [{"type": "message", "text": "Done, with tabs."}]},
]


def _script(path: Path, turns: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(turn) + "\n" for turn in turns))
    return str(path)


@pytest.fixture
async def lanes_server(server_factory: ServerFactory, tmp_path: Path) -> RunningServer:
    """The fast sim as 'sim-model', and two slow script routes for steering."""
    config = make_config(tmp_path)
    slow = dataclasses.replace(FAST_SIM, tokens_per_second=40)
    for model, turns in (("steer-model", STEER_SCRIPT), ("pending-model", PENDING_SCRIPT)):
        path = _script(tmp_path / f"{model}.jsonl", turns)
        config.models[model] = RouteConfig(engine="script", sim=slow, script_path=path)
    running: RunningServer = await server_factory(config, http=True)
    return running


@pytest.fixture
async def client(lanes_server: RunningServer) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{lanes_server.http_port}/v1",
        api_key="test",
        max_retries=0,
        timeout=10,
    )
    try:
        yield sdk
    finally:
        await sdk.close()


async def test_back_to_back_creates_on_one_lane_run_in_turn(client: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(30), client.responses.connect() as conn:
        for text in ("one", "two", "three"):
            await conn.response.create(model="sim-model", input=text, store=False)
        turns = [await next_turn(conn) for _ in range(3)]
    kinds = [[event.type for event in turn] for turn in turns]
    assert all(k[0] == "response.created" and k[-1] == "response.completed" for k in kinds)
    assert all("error" not in k for k in kinds)
    assert len({turn[-1].response.id for turn in turns}) == 3


async def test_a_create_on_another_lane_forks_an_unstored_response(
    client: openai.AsyncOpenAI,
) -> None:
    async with asyncio.timeout(30), client.responses.connect() as conn:
        await conn.response.create(
            model="sim-model", input="ls", tools=TOOLS, store=False, stream_id="a"
        )
        source = (await next_turn(conn))[-1].response
        (call,) = [item for item in source.output if item.type == "function_call"]
        output = [{"type": "function_call_output", "call_id": call.call_id, "output": "x"}]
        # A failed fork (a wrong call id) keeps the parent for its own lane...
        await conn.response.create(
            model="sim-model",
            tools=TOOLS,
            store=False,
            stream_id="b",
            previous_response_id=source.id,
            input=[{"type": "function_call_output", "call_id": "call_wrong", "output": "x"}],
        )
        (failed,) = await next_turn(conn)
        # ... and a fork from it is served from the connection's cache.
        await conn.response.create(
            model="sim-model",
            tools=TOOLS,
            store=False,
            stream_id="b",
            previous_response_id=source.id,
            input=output,  # type: ignore[arg-type]
        )
        fork = await next_turn(conn)
        await conn.response.create(
            model="sim-model",
            tools=TOOLS,
            store=False,
            stream_id="a",
            previous_response_id=source.id,
            input=output,  # type: ignore[arg-type]
        )
        same_lane = await next_turn(conn)

    assert failed.type == "error" and failed.error.param == "input[0].call_id"
    assert failed.stream_id == "b"
    for turn, lane in ((fork, "b"), (same_lane, "a")):
        response = turn[-1].response
        assert turn[-1].type == "response.completed"
        assert turn[-1].stream_id == lane
        assert response.previous_response_id == source.id
        assert response.usage is not None
        assert response.usage.input_tokens_details.cached_tokens > 0


async def test_the_33rd_named_lane_is_refused(client: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(30), client.responses.connect() as conn:
        for index in range(32):
            await conn.response.create(
                model="sim-model", input="hi", store=False, stream_id=f"lane-{index}"
            )
        ends = set()
        async for event in conn:
            if event.type in TERMINAL:
                ends.add(event.stream_id)
                if len(ends) == 32:
                    break
        await conn.response.create(model="sim-model", input="hi", stream_id="lane-32")
        (refused,) = await next_turn(conn)
        # The default lane and the lanes already used go on.
        await conn.response.create(model="sim-model", input="hi", store=False)
        default = await next_turn(conn)
        await conn.response.create(model="sim-model", input="hi", stream_id="lane-0")
        reused = await next_turn(conn)

    assert refused.type == "error"
    assert refused.error.code == "websocket_stream_limit_reached"
    assert refused.error.param == "stream_id"
    assert default[-1].type == "response.completed" and default[-1].stream_id is None
    assert reused[-1].type == "response.completed" and reused[-1].stream_id == "lane-0"


async def test_steer_stops_the_response_and_its_successor_follows(
    client: openai.AsyncOpenAI,
) -> None:
    async with asyncio.timeout(30), client.responses.connect() as conn:
        await conn.response.create(model="steer-model", input="fix the indentation", tools=TOOLS)
        events: list[Any] = []
        async for event in conn:
            events.append(event)
            if event.type == "response.output_text.delta":
                break
        target = events[0].response.id
        await conn.response.steer(previous_response_id=target, input="Use tabs, not spaces.")
        events = []
        async for event in conn:
            events.append(event)
            if event.type in TERMINAL and events[-1].response.id != target:
                break

    kinds = [event.type for event in events]
    assert kinds[0] == "response.steer.accepted"
    accepted = events[0]
    assert accepted.steer.previous_response_id == target
    ended = next(event for event in events if event.type in TERMINAL)
    assert ended.type == "response.incomplete"
    assert ended.response.incomplete_details is not None
    assert ended.response.incomplete_details.reason == "steered"
    # The message being generated was finished, never cut.
    (message,) = ended.response.output
    assert message.type == "message" and message.status == "completed"
    assert message.content[0].text == LONG_TEXT
    successor = events[kinds.index("response.created")].response
    assert successor.previous_response_id == target
    assert [tool.name for tool in successor.tools] == [SHELL_TOOL["name"]]
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Switching to tabs."


async def test_a_steer_waits_for_the_tool_outputs_of_a_response_ending_with_a_call(
    client: openai.AsyncOpenAI,
) -> None:
    async with asyncio.timeout(30), client.responses.connect() as conn:
        await conn.response.create(model="pending-model", input="find it", tools=TOOLS)
        response_id = ""
        async for event in conn:
            if event.type == "response.created":
                response_id = event.response.id
            if event.type == "response.output_item.added":
                break  # the call is streaming
        await conn.response.steer(
            previous_response_id=response_id,
            input=[{"type": "message", "role": "user", "content": "Only in src/."}],
        )
        events: list[Any] = []
        async for event in conn:
            events.append(event)
            if event.type == "response.steer.pending":
                break
        kinds = [event.type for event in events]
        pending = events[-1]
        completed = events[kinds.index("response.completed")].response
        call: Any = next(item for item in completed.output if item.type == "function_call")
        await conn.response.create(
            model="pending-model",
            tools=TOOLS,
            previous_response_id=response_id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "3 hits"}],
        )
        explicit = await next_turn(conn)
        items = await client.responses.input_items.list(explicit[-1].response.id)

    assert "response.steer.accepted" in kinds
    assert kinds.index("response.completed") < kinds.index("response.steer.pending")
    assert pending.reason == "waiting_for_required_input"
    assert [(stub.type, stub.call_id) for stub in pending.required_input] == [
        ("function_call_output", call.call_id)
    ]
    assert explicit[-1].type == "response.completed"
    assert explicit[-1].response.output_text == "Done, with tabs."
    # The queued steering input went before the client's own, in its one create.
    types = [item.type for item in reversed(items.data)]
    assert types == ["message", "function_call_output"]


async def test_steering_through_the_sdk_lane_helper(client: openai.AsyncOpenAI) -> None:
    async with (
        asyncio.timeout(30),
        client.responses.connect() as conn,
        AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session,
    ):
        lane = session.lane("agent")
        await lane.send({"type": "response.create", "model": "steer-model", "input": "go"})
        created = await lane.recv()
        assert created.type == "response.created"
        target = created.response.id
        while (await lane.recv()).type != "response.output_text.delta":
            pass
        await lane.send(
            {"type": "response.steer", "previous_response_id": target, "input": "Use tabs."}
        )
        steered = await lane.get_final_response()
        # The successor follows on the same lane: the helper collects it next.
        while True:
            event = await lane.recv()
            if event.type == "response.created":
                break
        successor = await lane.get_final_response()

    assert steered.id == target and steered.status == "incomplete"
    assert steered.incomplete_details is not None
    assert steered.incomplete_details.reason == "steered"
    assert successor.previous_response_id == target
    assert successor.status == "completed"
    assert successor.output_text == "Switching to tabs."
