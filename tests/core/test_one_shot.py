"""A one-shot create driven directly (``ResponsesCore.respond``): no stream, no session, a
scripted engine passed in through the composition root; and the typed caller."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

import pytest
from bidi_responses.server.core.tenancy.caller import Caller

from tests.core.fake_engine import ScriptedCore, ScriptedEngine, Turn

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 20
EngineAndCore = tuple[ScriptedEngine, ScriptedCore]


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": "sim-model", "input": "hi", **fields}


async def test_a_one_shot_create_streams_to_its_terminal_event(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    engine.turns.append(Turn(("Hello", " world")))
    async with asyncio.timeout(TIMEOUT_S):
        events = [cast(dict[str, Any], e) async for e in core.respond(_body(), "test")]
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.completed"
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert text == "Hello world"
        # The scripted engine came in through the root's engine factory.
        assert len(engine.requests) == 1
        # No stream was opened for it, and nothing stays behind.
        assert core.sessions_open == 0
        await core.wait_until_idle()


async def test_batches_hold_what_is_ready_together(engine_and_core: EngineAndCore) -> None:
    engine, core = engine_and_core
    engine.turns.append(Turn(("a", "b", "c")))
    async with asyncio.timeout(TIMEOUT_S):
        batches = [b async for b in core.respond_batches(_body(), "test", max_events=100)]
        flat = [e["type"] for batch in batches for e in batch]
        assert flat[0] == "response.created" and flat[-1] == "response.completed"
        assert all(1 <= len(batch) <= 100 for batch in batches)
        assert len(batches) < len(flat)  # some events went out together


async def test_a_refused_create_is_one_error_event(engine_and_core: EngineAndCore) -> None:
    _, core = engine_and_core
    async with asyncio.timeout(TIMEOUT_S):
        events = [e async for e in core.respond({"model": "sim-model", "input": 5}, "test")]
        assert len(events) == 1 and events[0]["type"] == "error"
        error = cast(dict[str, Any], events[0])["error"]
        assert error["param"] == "input" and error["request_type"] == "response.create"


async def test_closing_early_stops_the_run_and_keeps_its_usage(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    hold = asyncio.Event()
    engine.turns.append(Turn(("Hel",), hold=hold))
    async with asyncio.timeout(TIMEOUT_S):
        events = core.respond(_body(), "test")
        async with contextlib.aclosing(events):
            created = await anext(events)
            assert created["type"] == "response.created"
            await engine.holding.wait()
        # The reader went away: the engine's work is aborted, the response leaves its row.
        assert engine.cancelled.is_set()
        await core.wait_until_idle()
        await core.deps.post.join()
        rows = {row.response_id: row for row in await core.deps.store.ledger_rows()}
        response = cast(dict[str, Any], created)["response"]
        assert rows[response["id"]].status == "cancelled"


async def test_cut_streams_stops_a_one_shot_create_without_a_terminal_event(
    engine_and_core: EngineAndCore,
) -> None:
    engine, core = engine_and_core
    engine.turns.append(Turn(("Hel",), hold=asyncio.Event()))
    async with asyncio.timeout(TIMEOUT_S):
        seen: list[str] = []

        async def read() -> None:
            async for event in core.respond(_body(), "test"):
                seen.append(event["type"])

        reader = asyncio.get_running_loop().create_task(read())
        await engine.holding.wait()
        core.begin_drain()
        await core.cut_streams()
        await reader
        assert seen[0] == "response.created"
        assert not {"response.completed", "response.incomplete", "response.failed"} & set(seen)


async def test_the_caller_is_not_written_into_the_body(engine_and_core: EngineAndCore) -> None:
    engine, core = engine_and_core
    engine.turns.extend([Turn(), Turn()])
    labelled = Caller(None, "key_abc", "127.0.0.1:1")
    async with asyncio.timeout(TIMEOUT_S):
        plain = [e async for e in core.respond(_body(), "test", labelled)][-1]
        named = [e async for e in core.respond(_body(user="alice"), "test", labelled)][-1]
        await core.deps.post.join()
        rows = {row.response_id: row.tenant for row in await core.deps.store.ledger_rows()}
    plain_response = cast(dict[str, Any], plain)["response"]
    named_response = cast(dict[str, Any], named)["response"]
    assert plain_response["user"] is None and named_response["user"] == "alice"
    assert rows[plain_response["id"]] == "key_abc"
    assert rows[named_response["id"]] == "alice"


def test_whom_a_caller_charges_and_counts_against() -> None:
    assert Caller("team-a", None).account("alice") == "team-a"
    assert Caller(None, "key_x").account("alice") == "alice"
    assert Caller(None, "key_x").account(None) == "key_x"
    assert Caller().account(None) == "anonymous"
    assert Caller("team-a").quota_key == "team-a"
    assert Caller(None, "key_x").quota_key == "key_x"
    assert Caller().quota_key == "anonymous"
    # An idempotency key of an anonymous open-server caller stays unscoped, as before.
    assert Caller().idempotency_scope(None) is None
