"""``LeanQueue`` and ``LeanEvent`` behave as asyncio's own classes (the same scripts give the
same results, waiters and cancellations included) while holding no deque block each."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Callable

import pytest
from bidi_responses.server.core.process import LeanEvent, LeanQueue, SmallDeque

QueueFactory = Callable[[int], asyncio.Queue[int]]


async def _script(make: QueueFactory) -> list[object]:
    """Getters waiting on an empty queue, putters waiting on a full one, a cancelled waiter
    of each kind, get_nowait/put_nowait at the edges, and join after task_done."""
    seen: list[object] = []
    queue = make(2)
    getters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await asyncio.sleep(0)  # the getters wait (a yield to the loop, not a timing)
    getters[1].cancel()
    for item in (1, 2, 3, 4):
        await queue.put(item)
    results = await asyncio.gather(*getters, return_exceptions=True)
    seen.append([r if isinstance(r, int) else type(r).__name__ for r in results])
    seen.append((queue.qsize(), queue.full(), queue.empty()))
    putters = [asyncio.create_task(queue.put(item)) for item in (5, 6, 7)]
    await asyncio.sleep(0)
    putters[0].cancel()
    seen.append([queue.get_nowait() for _ in range(queue.qsize())])
    await asyncio.gather(*putters, return_exceptions=True)
    seen.append([queue.get_nowait() for _ in range(queue.qsize())])
    with pytest.raises(asyncio.QueueEmpty):
        queue.get_nowait()
    queue.put_nowait(8)
    queue.put_nowait(9)
    with pytest.raises(asyncio.QueueFull):
        queue.put_nowait(10)
    for _ in range(queue.qsize()):
        queue.get_nowait()
    for _ in range(9 - 1):
        queue.task_done()
    await asyncio.wait_for(queue.join(), 5)
    seen.append("joined")
    return seen


async def test_a_lean_queue_runs_a_script_as_asyncio_queue_does() -> None:
    async with asyncio.timeout(10):
        expected = await _script(lambda size: asyncio.Queue(size))
        got = await _script(lambda size: LeanQueue(size))
    assert got == expected
    assert expected[0] == [1, "CancelledError", 2]  # the script exercised a cancelled getter


async def test_a_lean_event_wakes_every_waiter_and_forgets_cancelled_ones() -> None:
    async with asyncio.timeout(10):
        event = LeanEvent()
        waiters = [asyncio.create_task(event.wait()) for _ in range(3)]
        await asyncio.sleep(0)
        waiters[0].cancel()
        await asyncio.sleep(0)
        assert len(event._waiters) == 2  # the cancelled waiter left
        event.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert [r is True for r in results] == [False, True, True]
        event.clear()
        assert not event.is_set() and not event._waiters


def test_a_small_deque_takes_from_either_end() -> None:
    items: SmallDeque[int] = SmallDeque([2, 3])
    items.appendleft(1)
    items.append(4)
    assert [items.popleft(), items.popleft()] == [1, 2] and items == [3, 4]


async def test_lean_primitives_hold_less_than_asyncio_s() -> None:
    def held(make: Callable[[], object]) -> int:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        kept = [make() for _ in range(100)]
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert len(kept) == 100
        return (after - before) // 100

    # asyncio's queue holds three deques and an event's (~760 bytes each); the lean one lists.
    assert held(lambda: LeanQueue(8)) < held(lambda: asyncio.Queue(8)) - 2000
    assert held(LeanEvent) < held(asyncio.Event) - 500
