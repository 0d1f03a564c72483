"""The backend stream's read deadline: one timer for the whole stream, with the semantics of
a timeout around each read (only waiting counts; the caller's own cancellation stays one)."""

from __future__ import annotations

import asyncio

import pytest
from bidi_responses.server.engines.completion_stream import _Watchdog


@pytest.mark.timeout(10)
async def test_a_read_past_the_deadline_times_out() -> None:
    loop = asyncio.get_running_loop()
    watch = _Watchdog(loop, loop.time() + 0.05)
    never: asyncio.Future[bytes] = loop.create_future()
    with pytest.raises(TimeoutError):
        await watch.wait(never)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    watch.close()


@pytest.mark.timeout(10)
async def test_a_moved_deadline_rearms_the_one_timer() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    watch = _Watchdog(loop, start + 0.05)
    for i in range(1, 6):
        # Each read completes before the deadline, which then moves past the first one.
        ready: asyncio.Future[bytes] = loop.create_future()
        loop.call_at(start + 0.03 * i, ready.set_result, b"x")
        assert await watch.wait(ready) == b"x"
        watch.deadline = loop.time() + 0.05
    assert loop.time() > start + 0.05  # the first deadline passed while reads kept coming
    never: asyncio.Future[bytes] = loop.create_future()
    with pytest.raises(TimeoutError):
        await watch.wait(never)
    watch.close()


@pytest.mark.timeout(10)
async def test_the_callers_cancellation_is_not_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    watch = _Watchdog(loop, loop.time() + 60)
    never: asyncio.Future[bytes] = loop.create_future()
    waiting = asyncio.Event()

    async def read() -> bytes:
        waiting.set()
        return await never

    task = asyncio.ensure_future(watch.wait(read()))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    watch.close()
