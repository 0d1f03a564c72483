"""The delta window (``streaming._merge``) and the engine's handoff to the streaming task
(``Handoff``), on a real event loop: what a window merges, what ends it, and which events
wake the task that waits in it."""

from __future__ import annotations

import asyncio

import pytest
from bidi_responses.server.config import StreamingConfig
from bidi_responses.server.core.ports import Delta, ItemEnd
from bidi_responses.server.core.runs.handoff import Handoff
from bidi_responses.server.core.runs.streaming import _WAKE, EngineOutput, _merge

TIMEOUT_S = 5.0
# Longer than any test may take: a merge that waited for it would fail by timeout.
LONG_WINDOW_MS = 60_000.0
CONFIG = StreamingConfig()


def _delta(text: str) -> Delta:
    return Delta(text=text, token_ids=tuple(range(len(text))))


async def test_deltas_arriving_within_the_window_join_and_the_window_ends_it() -> None:
    outputs: Handoff[EngineOutput] = Handoff()
    loop = asyncio.get_running_loop()
    outputs.put(_delta("b"))
    loop.call_soon(lambda: outputs.put(_delta("cd"), urgent=False))  # while it waits
    async with asyncio.timeout(TIMEOUT_S):
        text, count, pending = await _merge(outputs, "a", 1, 20.0, CONFIG)
    assert (text, count, pending) == ("abcd", 4, None)
    assert not outputs


async def test_an_item_end_within_the_window_ends_the_merge_at_once() -> None:
    outputs: Handoff[EngineOutput] = Handoff()
    end = ItemEnd()
    asyncio.get_running_loop().call_soon(outputs.put, end)
    async with asyncio.timeout(TIMEOUT_S):
        text, count, pending = await _merge(outputs, "a", 1, LONG_WINDOW_MS, CONFIG)
    assert (text, count) == ("a", 1)
    assert pending is end


async def test_a_stop_request_within_the_window_is_handed_back() -> None:
    outputs: Handoff[EngineOutput] = Handoff()
    asyncio.get_running_loop().call_soon(outputs.put, _WAKE)
    async with asyncio.timeout(TIMEOUT_S):
        _, _, pending = await _merge(outputs, "a", 1, LONG_WINDOW_MS, CONFIG)
    assert pending is _WAKE


@pytest.mark.parametrize("window_ms", [0.0, LONG_WINDOW_MS])
async def test_merging_stops_at_the_size_bound_without_waiting(window_ms: float) -> None:
    config = StreamingConfig(max_delta_chars=4)
    outputs: Handoff[EngineOutput] = Handoff()
    for text in ("bb", "cc", "dd"):
        outputs.put(_delta(text))
    async with asyncio.timeout(TIMEOUT_S):
        text, count, pending = await _merge(outputs, "a", 1, window_ms, config)
    assert (text, count, pending) == ("abbcc", 5, None)
    assert len(outputs) == 1  # the rest waits for the next event


async def test_without_a_window_only_what_waits_is_merged() -> None:
    outputs: Handoff[EngineOutput] = Handoff()
    outputs.put(_delta("b"))
    async with asyncio.timeout(TIMEOUT_S):
        text, count, pending = await _merge(outputs, "a", 1, 0.0, CONFIG)
    assert (text, count, pending) == ("ab", 2, None)
    assert not outputs


async def test_a_window_wakes_for_what_ends_the_deltas_not_for_each_delta() -> None:
    handoff: Handoff[EngineOutput] = Handoff()
    loop = asyncio.get_running_loop()
    end = ItemEnd()

    # Each put schedules the next: a wake-up on a delta would resume the waiter in between.
    def put_first() -> None:
        handoff.put(_delta("a"), urgent=False)
        loop.call_soon(put_second)

    def put_second() -> None:
        handoff.put(_delta("b"), urgent=False)
        loop.call_soon(handoff.put, end)

    loop.call_soon(put_first)
    async with asyncio.timeout(TIMEOUT_S):
        await handoff.wait_urgent(loop.time() + LONG_WINDOW_MS / 1000)
    assert len(handoff) == 3
    assert [handoff.pop(), handoff.pop()] == [_delta("a"), _delta("b")]
    assert handoff.pop() is end


async def test_a_get_wakes_for_any_event_and_a_window_ends_without_one() -> None:
    handoff: Handoff[EngineOutput] = Handoff()
    loop = asyncio.get_running_loop()
    loop.call_soon(lambda: handoff.put(_delta("a"), urgent=False))
    async with asyncio.timeout(TIMEOUT_S):
        assert await handoff.get() == _delta("a")
        await handoff.wait_urgent(loop.time() + 0.001)  # the deadline releases it
    assert not handoff


async def test_a_consumer_cancelled_while_waiting_leaves_the_handoff_usable() -> None:
    handoff: Handoff[EngineOutput] = Handoff()
    loop = asyncio.get_running_loop()
    waiting = asyncio.create_task(handoff.wait_urgent(loop.time() + LONG_WINDOW_MS / 1000))
    await asyncio.sleep(0)  # let it start waiting
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    loop.call_soon(handoff.put, _WAKE)
    async with asyncio.timeout(TIMEOUT_S):
        assert await handoff.get() is _WAKE
