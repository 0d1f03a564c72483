"""``Session`` driven directly: client events in through ``handle``, server events out of
``events``, a scripted engine behind it. No transport and no client.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from bidi_responses.schema import ServerEvent
from bidi_responses.server.core.lanes import StreamNaming
from bidi_responses.server.core.lanes.session import Session

from tests.core.fake_engine import Call, ScriptedEngine, Turn
from tests.core.session_events import (
    SHELL,
    TERMINAL,
    TIMEOUT_S,
    EngineAndCore,
    Event,
)
from tests.core.session_events import create as _create
from tests.core.session_events import session_of as _session
from tests.core.session_events import until as _until

pytestmark = pytest.mark.timeout(60)


def _json(event: ServerEvent) -> Event:
    """An event as a client reads it: plain JSON."""
    return cast(Event, event)


async def _until_terminal(session: Session) -> list[Event]:
    return await _until(session, lambda event: event["type"] in TERMINAL)


async def _until_holding(session: Session, engine: ScriptedEngine) -> list[Event]:
    """Events up to the first text delta, once the engine is holding its turn."""
    return await _until(
        session,
        lambda e: e["type"] == "response.output_text.delta" and engine.holding.is_set(),
    )


async def _turn(session: Session, **body: Any) -> Event:
    """Create a response; its terminal event (or the error event that refused it)."""
    await session.handle(_create(**body))
    events = await _until(session, lambda e: e["type"] in (*TERMINAL, "error"))
    return events[-1]


async def test_create_streams_a_response_and_a_continuation_extends_its_cached_prompt(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    engine.turns += [Turn(("Hello",)), Turn(("Again",))]
    async with _session(core) as session:
        await session.handle(_create(store=False))
        first = await _until_terminal(session)
        parent = first[-1]["response"]
        # Not stored: only the lane's cache can serve the continuation.
        second = await _turn(session, previous_response_id=parent["id"], input="more")

    assert first[0]["type"] == "response.created"
    assert first[-1]["type"] == "response.completed"
    assert parent["output"][0]["content"][0]["text"] == "Hello"
    assert second["type"] == "response.completed"
    assert second["response"]["previous_response_id"] == parent["id"]
    before, after = engine.prompts
    assert after[: len(before)] == before and len(after) > len(before)
    cached = second["response"]["usage"]["input_tokens_details"]["cached_tokens"]
    assert len(before) < cached < len(after)


async def test_an_unknown_previous_response_is_one_error_naming_the_field(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    async with _session(core) as session:
        error = await _turn(session, previous_response_id="resp_missing")

    assert error["type"] == "error"
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"
    assert engine.requests == []


async def test_a_create_on_a_busy_lane_waits_its_turn_while_another_lane_runs(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    hold = asyncio.Event()
    engine.turns += [Turn(("a",), hold=hold), Turn(("o",)), Turn(("b",))]
    async with _session(core) as session:
        await session.handle(_create())
        first = await _until_holding(session, engine)
        # Sent early: it waits for the first response's end, nothing is refused.
        await session.handle(_create())
        # Another lane of the same stream is a conversation of its own and runs at once.
        await session.handle(_create(stream_id="other"))
        other: list[tuple[str, Event]] = []
        async for out in session.events():
            other.append((out.lane, _json(out.data)))
            if out.data["type"] in TERMINAL:
                break
        assert session.machine.queued == 1
        hold.set()
        rest = await _until_terminal(session)
        second = await _until_terminal(session)

    assert {lane for lane, _ in other} == {"other"}
    assert other[-1][1]["type"] == "response.completed"
    # In order, without overlap: the second response starts after the first's terminal.
    assert rest[-1]["response"]["id"] == first[0]["response"]["id"]
    assert rest[-1]["type"] == "response.completed"
    assert second[0]["type"] == "response.created"
    assert second[-1]["type"] == "response.completed"
    assert second[-1]["response"]["output"][0]["content"][0]["text"] == "b"
    assert len(engine.requests) == 3


async def test_cancel_ends_the_response_incomplete_with_its_partial_output(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    engine.turns.append(Turn(("partial",), hold=asyncio.Event()))
    async with _session(core) as session:
        await session.handle({"type": "response.cancel", "response_id": "resp_none"})
        not_found = _json((await anext(session.events())).data)
        await session.handle(_create())
        started = await _until_holding(session, engine)
        response_id = started[0]["response"]["id"]
        await session.handle({"type": "response.cancel", "response_id": response_id})
        rest = await _until_terminal(session)

    assert not_found["error"]["code"] == "response_not_found"
    assert engine.cancelled.is_set()
    terminal = rest[-1]
    assert terminal["type"] == "response.incomplete"
    response = terminal["response"]
    assert response["id"] == response_id
    assert response["incomplete_details"] == {"reason": "cancelled"}
    (item,) = response["output"]
    assert item["status"] == "incomplete"
    assert item["content"][0]["text"] == "partial"
    assert response["usage"]["output_tokens"] == 1


async def test_append_mode_waits_in_response_done_and_an_append_resumes_it(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    engine.turns += [Turn((), calls=(Call("call_1", "shell", '{"cmd": "ls"}'),)), Turn(("done",))]
    async with _session(core) as session:
        await session.handle(_create(tools=[SHELL], append_mode=True))
        paused = (await _until(session, lambda e: e["type"] == "response.done"))[-1]
        response_id = paused["response"]["id"]
        answer = {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}
        await session.handle(
            {"type": "response.append", "response_id": response_id, "input": [answer]}
        )
        rest = await _until_terminal(session)

    assert [call["call_id"] for call in paused["pending_calls"]] == ["call_1"]
    terminal = rest[-1]
    assert terminal["type"] == "response.completed"
    assert terminal["response"]["id"] == response_id
    kinds = [item["type"] for item in terminal["response"]["output"]]
    assert kinds == ["function_call", "message"]
    # The second segment's prompt extends the first with the call and its output.
    before, after = engine.prompts
    assert after[: len(before)] == before and len(after) > len(before)


async def test_an_append_that_answers_another_call_is_refused_and_the_response_still_waits(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    engine.turns += [Turn((), calls=(Call("call_1", "shell"),)), Turn(("done",))]
    async with _session(core) as session:
        await session.handle(_create(tools=[SHELL], append_mode=True))
        paused = (await _until(session, lambda e: e["type"] == "response.done"))[-1]
        response_id = paused["response"]["id"]

        def append(call_id: str) -> Event:
            output = {"type": "function_call_output", "call_id": call_id, "output": "ok"}
            return {"type": "response.append", "response_id": response_id, "input": [output]}

        await session.handle(append("call_other"))
        mismatch = _json((await anext(session.events())).data)
        await session.handle({**append("call_1"), "response_id": "resp_other"})
        not_waiting = _json((await anext(session.events())).data)
        await session.handle(append("call_1"))
        rest = await _until_terminal(session)

    assert mismatch["type"] == "error"
    assert mismatch["error"]["code"] == "call_id_mismatch"
    assert mismatch["error"]["param"] == "input[0].call_id"
    assert not_waiting["error"]["code"] == "response_not_waiting"
    assert rest[-1]["type"] == "response.completed"
    assert len(engine.requests) == 2


async def test_a_failed_continuation_evicts_the_response_it_referenced(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    engine.turns += [Turn(), Turn(("partial",), fail="backend down")]
    async with _session(core) as session:
        parent = (await _turn(session, store=False))["response"]
        failed = await _turn(session, store=False, previous_response_id=parent["id"])
        retry = await _turn(session, store=False, previous_response_id=parent["id"])

    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "backend_failed"
    assert retry["type"] == "error"
    assert retry["error"]["code"] == "previous_response_not_found"
    assert len(engine.requests) == 2


async def test_the_lane_cache_keeps_at_most_max_responses(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    core.config.cache.max_responses = 2
    engine.turns += [Turn() for _ in range(5)]
    async with _session(core) as session:
        ids = [(await _turn(session, store=False))["response"]["id"] for _ in range(3)]
        # The oldest of three went; the two most recent are both continuable.
        evicted = await _turn(session, store=False, previous_response_id=ids[0])
        kept = await _turn(session, store=False, previous_response_id=ids[1])
        newest = await _turn(session, store=False, previous_response_id=ids[2])

    assert evicted["type"] == "error"
    assert evicted["error"]["code"] == "previous_response_not_found"
    assert kept["type"] == newest["type"] == "response.completed"


async def test_the_lane_cache_keeps_at_most_max_bytes(engine_and_core: EngineAndCore) -> None:
    engine, core = engine_and_core
    cache = core.config.cache
    cache.max_responses = 10
    engine.turns += [Turn() for _ in range(4)]
    # One response's state, as the caches measure it, on a stream of its own.
    async with _session(core) as probe:
        await _turn(probe, store=False)
        one_state = core.deps.cache_budget.used
    assert one_state > 0
    cache.max_bytes = one_state * 3 // 2  # room for one such state, not two

    async with _session(core) as session:
        first = (await _turn(session, store=False))["response"]["id"]
        second = (await _turn(session, store=False))["response"]["id"]
        evicted = await _turn(session, store=False, previous_response_id=first)
        kept = await _turn(session, store=False, previous_response_id=second)

    assert evicted["type"] == "error"
    assert evicted["error"]["code"] == "previous_response_not_found"
    assert kept["type"] == "response.completed"


async def test_closing_the_session_cancels_engine_work_and_keeps_its_usage(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    engine.turns.append(Turn(("partial",), hold=asyncio.Event()))
    session = core.open_session(StreamNaming("test"))
    async with asyncio.timeout(TIMEOUT_S):
        await session.handle(_create())
        started = await _until_holding(session, engine)
        response_id = started[0]["response"]["id"]
        assert response_id in core.deps.state.inflight
        # The client went away: no terminal event can reach it.
        await core.close_session(session)
        await core.deps.post.join()
        rows = await core.deps.store.ledger_rows()

    assert engine.cancelled.is_set()
    assert not core.deps.state.inflight and core.sessions_open == 0
    assert len(core.deps.cache_budget) == 0
    (row,) = rows
    assert row.response_id == response_id
    assert row.status == "cancelled"
    assert row.output_tokens == 1


async def test_half_close_ends_a_response_waiting_for_tool_outputs_and_then_the_stream(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    engine.turns.append(Turn((), calls=(Call("call_1", "shell"),)))
    async with _session(core) as session:
        await session.handle(_create(tools=[SHELL], append_mode=True))
        await _until(session, lambda e: e["type"] == "response.done")
        # The client will send nothing more: no append can come.
        await session.finish()
        rest = [_json(out.data) async for out in session.events()]

    assert [e["type"] for e in rest] == ["response.incomplete"]
    assert rest[0]["response"]["incomplete_details"] == {"reason": "client_gone"}
    assert len(engine.requests) == 1


async def test_lanes_are_named_by_stream_id_and_bounded_per_stream(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    core.config.limits.max_lanes = 2
    engine.turns += [Turn(), Turn()]
    async with _session(core) as session:
        bad_name = await _turn(session, stream_id="no spaces")
        first = await _turn(session, stream_id="a")
        second = await _turn(session, stream_id="b")
        third = await _turn(session, stream_id="c")

    assert bad_name["error"]["code"] == "invalid_stream_id"
    assert bad_name["error"]["param"] == "stream_id"
    assert first["type"] == second["type"] == "response.completed"
    assert third["error"]["code"] == "stream_limit_reached"
    assert third["error"]["param"] == "stream_id"
    assert len(engine.requests) == 2


async def test_past_the_active_limit_creates_on_other_lanes_wait_and_the_queue_is_bounded(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    core.config.limits.max_active_responses = 1
    core.config.limits.max_queued_responses = 1
    hold = asyncio.Event()
    engine.turns += [Turn(("a",), hold=hold), Turn(("b",))]
    async with _session(core) as session:
        await session.handle(_create(stream_id="a"))
        await _until_holding(session, engine)
        await session.handle(_create(stream_id="b"))  # waits for a slot
        await session.handle(_create(stream_id="c"))  # past the queue's bound
        (refused,) = await _until(session, lambda e: True)
        hold.set()
        first = await _until_terminal(session)
        second = await _until_terminal(session)

    assert refused["type"] == "error"
    assert refused["error"]["code"] == "too_many_queued_responses"
    assert first[-1]["type"] == second[-1]["type"] == "response.completed"
    # The waiting create began only once the running one had ended.
    assert second[0]["type"] == "response.created"
    assert second[-1]["response"]["output"][0]["content"][0]["text"] == "b"
    assert len(engine.requests) == 2
