"""``ResponseRun`` driven directly: a scripted engine, events collected in a list.

No transport, no client and no session: what these tests see is what a run hands its
session (``test_session.py`` drives the session).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from typing import Any, cast

from bidi_responses.schema import Item, ResponseEvent
from bidi_responses.server.core.conversation.state import ResponseCache
from bidi_responses.server.core.rendering.render import TokenArray
from bidi_responses.server.core.runs.lane import Lane
from bidi_responses.server.core.runs.runner import ResponseRun

from tests.core.fake_engine import ScriptedCore, ScriptedEngine, Turn

TIMEOUT_S = 20

MESSAGE_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def _lane(core: ScriptedCore) -> Lane:
    cache = core.config.cache
    return Lane("", ResponseCache(cache.max_responses, cache.max_bytes, core.deps.cache_budget))


async def _run(core: ScriptedCore, lane: Lane, **body: Any) -> list[dict[str, Any]]:
    """One response run to its end on ``lane``; the events it emitted, in order."""
    events: list[dict[str, Any]] = []

    async def emit(event: ResponseEvent) -> None:
        events.append(cast(dict[str, Any], event))  # read back as plain JSON below

    request = {"model": "sim-model", "input": "hi", **body}
    run = ResponseRun(core.deps, lane, request, emit, "test", time.perf_counter())
    lane.inflight = run
    async with asyncio.timeout(TIMEOUT_S):
        await run.run()
    return events


async def test_events_come_in_order_with_usage(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    engine.turns.append(Turn(("Hello", " world")))
    events = await _run(core, _lane(core))

    # Deltas already waiting are merged into one event (streaming.coalesce_deltas).
    kinds = [e["type"] for e in events]
    assert [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]] == MESSAGE_EVENTS
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == "Hello world"
    response = events[-1]["response"]
    assert response["status"] == "completed"
    assert response["output"][0]["content"][0]["text"] == "Hello world"
    assert response["usage"]["input_tokens"] == len(engine.prompts[0]) > 0
    assert response["usage"]["output_tokens"] == 2
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 0


async def test_continuation_takes_the_parent_from_the_cache_and_puts_itself(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    engine.turns += [Turn(), Turn(("Again",))]
    lane = _lane(core)
    assert lane.cache is not None
    first = (await _run(core, lane))[-1]["response"]
    assert first["id"] in lane.cache

    second = (await _run(core, lane, previous_response_id=first["id"], input="more"))[-1]
    assert second["type"] == "response.completed"
    # The parent's state moved into the child: taken out of the cache, the child put in.
    assert first["id"] not in lane.cache
    assert second["response"]["id"] in lane.cache
    # The second prompt extends the first (its prompt and output) instead of re-rendering it.
    before, after = engine.prompts
    assert after[: len(before)] == before
    cached = second["response"]["usage"]["input_tokens_details"]["cached_tokens"]
    assert len(before) < cached < len(after)


async def test_failure_evicts_the_parent(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    engine.turns += [Turn(), Turn(("partial",), fail="backend down")]
    lane = _lane(core)
    assert lane.cache is not None
    # Not stored, so the cache is the only place the parent lives.
    first = (await _run(core, lane, store=False))[-1]["response"]

    failed = await _run(core, lane, previous_response_id=first["id"], store=False)
    assert failed[-1]["type"] == "response.failed"
    assert failed[-1]["response"]["error"] == {"code": "backend_failed", "message": "backend down"}
    assert first["id"] not in lane.cache and len(lane.cache) == 0

    retry = await _run(core, lane, previous_response_id=first["id"], store=False)
    assert [e["type"] for e in retry] == ["error"]
    assert retry[0]["error"]["code"] == "previous_response_not_found"
    assert retry[0]["error"]["param"] == "previous_response_id"


async def test_bad_request_is_one_error_event_naming_the_field(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    events = await _run(
        core,
        _lane(core),
        tools=[{"type": "function", "name": "f"}],
        tool_choice={"type": "function", "name": "g"},
    )
    assert [e["type"] for e in events] == ["error"]
    assert events[0]["error"]["param"] == "tool_choice.name"
    assert engine.requests == []


async def test_same_tools_reuse_the_lanes_tool_set(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    engine.turns += [Turn(), Turn()]
    lane = _lane(core)
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    first = (await _run(core, lane, tools=tools))[-1]["response"]
    toolset = lane.toolset
    assert toolset is not None and toolset.function_names == {"f"}
    # The same list again (a new, equal object, with its keys in another order) reuses it.
    again = [{"parameters": {"type": "object"}, "name": "f", "type": "function"}]
    await _run(core, lane, tools=again, previous_response_id=first["id"])
    assert lane.toolset is toolset
    assert engine.requests[1].tools is toolset.functions


async def test_a_long_answer_is_rendered_off_the_loop_into_the_same_tokens(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    """An answer of at least ``limits.offload_chars`` characters is rendered onto the
    conversation in a worker thread, as a large input is, and the next turn's prompt is the
    one an inline render gives."""
    engine, core = engine_and_core
    renderer = core.deps.renderer
    render_items = renderer.render_items
    rendered: list[tuple[str, bool]] = []  # (the first item's type, on the loop's thread)

    def spy(items: Iterable[Item], call_names: dict[str, str], out: TokenArray) -> int:
        listed = list(items)
        on_loop = threading.current_thread() is threading.main_thread()
        rendered.append((str(listed[0].get("role", listed[0]["type"])), on_loop))
        return render_items(listed, call_names, out)

    renderer.render_items = spy  # type: ignore[method-assign]
    answer = tuple(f" word{n}" for n in range(400))  # about 3,000 characters
    prompts: list[list[int]] = []
    for offload_chars in (1_000_000, 1_000):  # inline, then in a worker thread
        core.config.limits.offload_chars = offload_chars
        engine.turns += [Turn(answer), Turn(("ok",))]
        lane = _lane(core)
        first = await _run(core, lane)
        assert first[-1]["response"]["status"] == "completed"
        previous = first[-1]["response"]["id"]
        second = await _run(core, lane, input="next", previous_response_id=previous)
        assert second[-1]["response"]["status"] == "completed"
        prompts.append(engine.prompts[-1])
    inline, offloaded = rendered[:4], rendered[4:]
    short = [("user", True), ("assistant", True)]  # each turn's input, then its answer
    assert inline == short + short
    assert offloaded == [("user", True), ("assistant", False), *short]
    assert prompts[0] == prompts[1]
