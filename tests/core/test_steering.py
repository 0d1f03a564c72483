"""Steering and queued lanes through ``Session``, with a scripted engine: the target stops at
an output boundary, its automatic successor runs, the pending path waits for tool outputs.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from tests.core.fake_engine import Call, ScriptedEngine, Turn
from tests.core.session_events import (
    SHELL,
    TERMINAL,
    EngineAndCore,
    Event,
)
from tests.core.session_events import create as _create
from tests.core.session_events import session_of as _session
from tests.core.session_events import until as _until

pytestmark = pytest.mark.timeout(60)


def _steer(target: str, text: Any = "use tabs, not spaces") -> Event:
    return {"type": "response.steer", "previous_response_id": target, "input": text}


def _conversation(engine: ScriptedEngine, index: int) -> list[Any]:
    """The items the engine saw for request ``index`` (a live view: later output shows)."""
    conversation = engine.requests[index].conversation
    assert conversation is not None
    return cast(list[Any], conversation.items)


def _text_of(items: list[Any]) -> str:
    """The text of every user message among ``items``."""
    texts = []
    for item in items:
        if item.get("type") == "message" and item.get("role") == "user":
            content = item["content"]
            if isinstance(content, str):
                texts.append(content)
            else:
                texts.extend(part.get("text", "") for part in content)
    return " | ".join(texts)


async def test_a_steered_response_stops_after_its_item_and_a_successor_takes_the_input(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    hold = asyncio.Event()
    # The message is being generated when the steer arrives; a function call would follow.
    engine.turns += [
        Turn(("Reading",), hold=hold, calls=(Call("call_1", "shell"),)),
        Turn(("Tabs it is",)),
    ]
    async with _session(core) as session:
        await session.handle(_create(tools=[SHELL], store=True))
        started = await _until(
            session, lambda e: e["type"] == "response.output_text.delta" and engine.holding.is_set()
        )
        target = started[0]["response"]["id"]
        await session.handle(_steer(target))
        (accepted,) = await _until(session, lambda e: True)
        hold.set()
        ended = await _until(session, lambda e: e["type"] in TERMINAL)
        successor = await _until(session, lambda e: e["type"] in TERMINAL)
        await core.deps.post.join()
        rows = await core.deps.store.ledger_rows()
        stored = await core.deps.store.get(successor[-1]["response"]["id"], None)

    assert accepted["type"] == "response.steer.accepted"
    assert accepted["steer"]["previous_response_id"] == target
    assert accepted["steer"]["id"].startswith("steer")
    last = ended[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "steered"}
    # The item in progress was finished, never cut; the call that would follow never started.
    (message,) = last["response"]["output"]
    assert message["type"] == "message" and message["status"] == "completed"
    assert message["content"][0]["text"] == "Reading"
    assert successor[0]["type"] == "response.created"
    assert successor[0]["response"]["previous_response_id"] == target
    assert successor[-1]["type"] == "response.completed"
    # Inherited settings: the tools of the target.
    assert successor[-1]["response"]["tools"][0]["name"] == "shell"
    # The successor continues the cached target: its prompt extends the target's.
    assert engine.prompts[1][: len(engine.prompts[0])] == engine.prompts[0]
    assert stored is not None
    assert "use tabs" in _text_of(cast(list[Any], stored.input_items))
    assert sorted(row.response_id for row in rows) == sorted(
        [target, successor[-1]["response"]["id"]]
    )


async def test_a_response_steered_before_its_first_item_stops_at_once(
    engine_and_core: EngineAndCore,
) -> None:
    """Nothing sampled yet is a boundary: the target stops without waiting for its engine's
    first item (the engine is never released here, so waiting would time out)."""
    engine, core = engine_and_core
    never = asyncio.Event()
    engine.turns += [Turn(("Slow",), first_hold=never), Turn(("Quick",))]
    async with _session(core) as session:
        await session.handle(_create())
        created = await _until(session, lambda e: e["type"] == "response.created")
        target = created[0]["response"]["id"]
        await engine.holding.wait()
        await session.handle(_steer(target))
        ended = await _until(session, lambda e: e["type"] in TERMINAL)
        successor = await _until(session, lambda e: e["type"] in TERMINAL)

    assert "response.steer.accepted" in [event["type"] for event in ended]
    last = ended[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "steered"}
    assert last["response"]["output"] == []
    assert engine.cancelled.is_set()  # the engine's work was aborted, not waited for
    assert successor[0]["response"]["previous_response_id"] == target
    assert successor[-1]["type"] == "response.completed"
    assert _text_of(_conversation(engine, 1)).endswith("use tabs, not spaces")


async def test_a_response_that_finishes_first_completes_and_still_gets_its_successor(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    hold = asyncio.Event()
    engine.turns += [Turn(("Done",), hold=hold), Turn(("More",))]
    async with _session(core) as session:
        await session.handle(_create())
        started = await _until(
            session, lambda e: e["type"] == "response.output_text.delta" and engine.holding.is_set()
        )
        target = started[0]["response"]["id"]
        await session.handle(_steer(target, [{"role": "user", "content": "one"}]))
        await session.handle(
            _steer(target, [{"type": "message", "role": "user", "content": "two"}])
        )
        acks = await _until(session, lambda e: e["type"] == "response.steer.accepted")
        acks += await _until(session, lambda e: e["type"] == "response.steer.accepted")
        hold.set()
        ended = await _until(session, lambda e: e["type"] in TERMINAL)
        successor = await _until(session, lambda e: e["type"] in TERMINAL)

    assert len({ack["steer"]["id"] for ack in acks}) == 2
    assert ended[-1]["type"] == "response.completed"
    assert successor[0]["response"]["previous_response_id"] == target
    assert successor[-1]["type"] == "response.completed"
    # One successor for both steers, their input in submission order.
    assert len(engine.requests) == 2
    # (the engine's view of the conversation, which the successor's output then extended)
    items = _conversation(engine, 1)
    assert _text_of(items) == "hi | one | two"


async def test_a_target_ending_with_tool_calls_leaves_the_input_for_the_next_create(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    hold = asyncio.Event()
    engine.turns += [Turn((), calls=(Call("call_1", "shell"),), call_hold=hold), Turn(("ok",))]
    async with _session(core) as session:
        await session.handle(_create(tools=[SHELL], stream_id="a"))
        started = await _until(session, lambda e: engine.holding.is_set())
        target = started[0]["response"]["id"]
        await session.handle(_steer(target))
        await _until(session, lambda e: e["type"] == "response.steer.accepted")
        hold.set()
        ended = await _until(session, lambda e: e["type"] == "response.steer.pending")
        # A continuation that fails keeps the queued input for the next one, and its error
        # names the client's own item (the steering input does not shift the indices).
        await session.handle(
            _create(
                tools=[SHELL],
                stream_id="a",
                previous_response_id=target,
                input=[{"type": "function_call_output", "call_id": "call_no", "output": "x"}],
            )
        )
        (refused,) = await _until(session, lambda e: True)
        await session.handle(
            _create(
                tools=[SHELL],
                stream_id="a",
                previous_response_id=target,
                input=[{"type": "function_call_output", "call_id": "call_1", "output": "x"}],
            )
        )
        explicit = await _until(session, lambda e: e["type"] in TERMINAL)

    kinds = [e["type"] for e in ended]
    assert kinds[-2:] == ["response.completed", "response.steer.pending"]
    pending = ended[-1]
    assert pending["reason"] == "waiting_for_required_input"
    assert pending["required_input"] == [
        {"type": "function_call_output", "call_id": "call_1", "name": "shell"}
    ]
    assert refused["type"] == "error"
    assert refused["error"]["param"] == "input[0].call_id"
    assert explicit[-1]["type"] == "response.completed"
    # No automatic successor: the client's create carried the queued input, before its own.
    assert len(engine.requests) == 2
    items = _conversation(engine, 1)
    kinds = [item["type"] for item in items]
    output = kinds.index("function_call_output")
    assert kinds[output - 2 : output] == ["function_call", "message"]
    assert _text_of(items[output - 1 : output]) == "use tabs, not spaces"


@pytest.mark.parametrize(
    ("steer", "field"),
    [
        ({"stream_id": "a"}, "stream_id"),
        ({"input": [{"role": "assistant", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
            "input[0].type",
        ),
        ({"input": []}, "input"),
        (
            {"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
            "input[0].content[0].type",
        ),
    ],
)
async def test_bad_steers_fail_naming_the_field_and_the_stream_goes_on(
    engine_and_core: EngineAndCore, steer: Event, field: str
) -> None:
    engine, core = engine_and_core
    engine.turns += [Turn(("a",))]
    async with _session(core) as session:
        await session.handle({**_steer("resp_x"), **steer})
        (failed,) = await _until(session, lambda e: True)
        await session.handle(_create())
        after = await _until(session, lambda e: e["type"] in TERMINAL)

    assert failed["type"] == "response.steer.failed"
    assert failed["error"]["code"] == "invalid_input"
    assert failed["error"]["type"] == "invalid_request_error"
    assert f"'{field}" in failed["error"]["message"]
    assert "id" not in failed["steer"]
    assert after[-1]["type"] == "response.completed"


async def test_steers_for_unknown_and_finished_targets_and_past_the_bound_fail(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    core.config.limits.max_pending_steers = 1
    hold = asyncio.Event()
    engine.turns += [Turn(("a",)), Turn(("b",), hold=hold), Turn(("c",))]
    async with _session(core) as session:
        await session.handle(_steer("resp_unknown"))
        (unknown,) = await _until(session, lambda e: True)
        await session.handle(_create(stream_id="x"))
        done = (await _until(session, lambda e: e["type"] in TERMINAL))[-1]["response"]["id"]
        await session.handle(_steer(done))
        (finished,) = await _until(session, lambda e: True)
        await session.handle(_create())
        started = await _until(session, lambda e: engine.holding.is_set())
        target = started[0]["response"]["id"]
        await session.handle(_steer(target))
        await session.handle(_steer(target))
        answers = await _until(session, lambda e: e["type"] == "response.steer.failed")
        hold.set()
        await _until(session, lambda e: e["type"] in TERMINAL)
        await _until(session, lambda e: e["type"] in TERMINAL)

    assert unknown["error"]["code"] == "response_not_found"
    assert finished["type"] == "response.steer.failed"
    assert finished["error"]["code"] == "response_already_completed"
    assert finished["steer"]["input"] == "use tabs, not spaces"
    assert [e["type"] for e in answers][-2:] == [
        "response.steer.accepted",
        "response.steer.failed",
    ]
    assert answers[-1]["error"]["code"] == "too_many_pending_steers"


async def test_in_append_mode_the_inject_that_answers_the_calls_takes_the_steering_input(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    hold = asyncio.Event()
    engine.turns += [Turn((), calls=(Call("call_1", "shell"),), call_hold=hold), Turn(("ok",))]
    async with _session(core) as session:
        await session.handle(_create(tools=[SHELL], append_mode=True))
        started = await _until(session, lambda e: engine.holding.is_set())
        target = started[0]["response"]["id"]
        await session.handle(_steer(target))
        await _until(session, lambda e: e["type"] == "response.steer.accepted")
        hold.set()
        paused = await _until(session, lambda e: e["type"] == "response.steer.pending")
        outputs = [{"type": "function_call_output", "call_id": "call_1", "output": "x"}]
        await session.handle({"type": "response.inject", "response_id": target, "input": outputs})
        resumed = await _until(session, lambda e: e["type"] in TERMINAL)
        await session.handle({"type": "response.inject", "response_id": target, "input": outputs})
        (late,) = await _until(session, lambda e: True)
        await session.handle({"type": "response.inject", "response_id": "resp_x", "input": outputs})
        (unknown,) = await _until(session, lambda e: True)

    kinds = [e["type"] for e in paused]
    # One response throughout: it waits for the tool outputs, and the steer with it.
    assert kinds[-2:] == ["response.done", "response.steer.pending"]
    assert resumed[0] == {
        "type": "response.inject.created",
        "response_id": target,
        "sequence_number": resumed[0]["sequence_number"],
    }
    assert resumed[-1]["type"] == "response.completed"
    assert resumed[-1]["response"]["id"] == target
    assert len(engine.requests) == 2
    items = _conversation(engine, 1)
    kinds = [item["type"] for item in items]
    output = kinds.index("function_call_output")
    assert kinds[output - 2 : output] == ["function_call", "message"]
    assert _text_of(items[output - 1 : output]) == "use tabs, not spaces"
    assert late["type"] == "response.inject.failed"
    assert late["error"]["code"] == "response_already_completed"
    assert late["input"] == outputs
    assert unknown["error"]["code"] == "response_not_found"
