"""The delta window (``streaming._merge``) on a real event loop: what it merges, what ends it,
and the window markers it leaves behind."""

from __future__ import annotations

import asyncio

import pytest
from bidi_responses.server.config import StreamingConfig
from bidi_responses.server.core.runs.streaming import _WAKE, EngineOutput, _merge, _WindowEnd
from bidi_responses.server.engines.base import Delta, ItemEnd

TIMEOUT_S = 5.0
# Longer than any test may take: a merge that waited for it would fail by timeout.
LONG_WINDOW_MS = 60_000.0
CONFIG = StreamingConfig()


def _delta(text: str) -> Delta:
    return Delta(text=text, token_ids=tuple(range(len(text))))


async def test_deltas_arriving_within_the_window_join_and_the_window_ends_it() -> None:
    queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    queue.put_nowait(_delta("b"))
    loop.call_soon(queue.put_nowait, _delta("cd"))  # arrives while the merge waits
    async with asyncio.timeout(TIMEOUT_S):
        text, count, pending = await _merge(queue, "a", 1, 20.0, CONFIG)
    assert (text, count, pending) == ("abcd", 4, None)
    # Its own marker ended it and was taken: nothing of this merge is left to end the next.
    assert queue.empty()


async def test_an_item_end_within_the_window_ends_the_merge_at_once() -> None:
    queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
    end = ItemEnd()
    asyncio.get_running_loop().call_soon(queue.put_nowait, end)
    async with asyncio.timeout(TIMEOUT_S):
        text, count, pending = await _merge(queue, "a", 1, LONG_WINDOW_MS, CONFIG)
    assert (text, count) == ("a", 1)
    assert pending is end


async def test_a_stop_request_within_the_window_is_handed_back() -> None:
    queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
    asyncio.get_running_loop().call_soon(queue.put_nowait, _WAKE)
    async with asyncio.timeout(TIMEOUT_S):
        _, _, pending = await _merge(queue, "a", 1, LONG_WINDOW_MS, CONFIG)
    assert pending is _WAKE


async def test_an_earlier_merges_marker_is_skipped_not_taken_as_this_windows_end() -> None:
    queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
    for event in (_WindowEnd(), _delta("b"), _WindowEnd(), _delta("c"), ItemEnd()):
        queue.put_nowait(event)
    async with asyncio.timeout(TIMEOUT_S):
        text, count, pending = await _merge(queue, "a", 1, LONG_WINDOW_MS, CONFIG)
    assert (text, count) == ("abc", 3)
    assert isinstance(pending, ItemEnd)


@pytest.mark.parametrize("window_ms", [0.0, LONG_WINDOW_MS])
async def test_merging_stops_at_the_size_bound_without_waiting(window_ms: float) -> None:
    config = StreamingConfig(max_delta_chars=4)
    queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
    for text in ("bb", "cc", "dd"):
        queue.put_nowait(_delta(text))
    async with asyncio.timeout(TIMEOUT_S):
        text, count, pending = await _merge(queue, "a", 1, window_ms, config)
    assert (text, count, pending) == ("abbcc", 5, None)
    assert queue.qsize() == 1  # the rest waits for the next event


async def test_without_a_window_only_what_waits_is_merged() -> None:
    queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
    queue.put_nowait(_delta("b"))
    async with asyncio.timeout(TIMEOUT_S):
        text, count, pending = await _merge(queue, "a", 1, 0.0, CONFIG)
    assert (text, count, pending) == ("ab", 2, None)
    assert queue.empty()
