"""The engine task's events on their way to the task that streams them.

One producer, one consumer, unbounded (the engine is paced by its own clock, not by the
consumer): a deque and at most one waiting consumer. ``asyncio.Queue`` would do, but it wakes
its getter for every item, and its ``get`` costs a future, a loop lookup and bookkeeping each
time. Here the consumer may also wait for an *urgent* item or a deadline while other items
pile up without waking it: a delta window wants the deltas that arrive in it merged, and is
cut short only by what ends a run of deltas (an item's end, the engine's finish, a failure, a
stop request). At a thousand tokens a second and the default 2 ms window, the streaming task
then wakes once a window instead of once a token.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    """Items from one producer task to one consumer task, in order."""

    __slots__ = ("_items", "_urgent_only", "_waiter")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._urgent_only = False

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T, *, urgent: bool = True) -> None:
        """Hand ``item`` over; wakes the consumer unless it waits for an urgent item and
        ``item`` is not one."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and (urgent or not self._urgent_only):
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def pop(self) -> T:
        """The oldest item (IndexError when there is none)."""
        return self._items.popleft()

    async def get(self) -> T:
        """The oldest item, waiting for one."""
        while not self._items:
            await self._wait(urgent_only=False, deadline=None)
        return self._items.popleft()

    async def wait_urgent(self, deadline: float) -> None:
        """Return at ``deadline`` (the loop's clock) or as soon as an urgent item is put,
        whichever comes first; other items put meanwhile wait without waking the consumer."""
        await self._wait(urgent_only=True, deadline=deadline)

    async def _wait(self, *, urgent_only: bool, deadline: float | None) -> None:
        if self._waiter is not None:
            raise RuntimeError("a Handoff has one consumer")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        self._urgent_only = urgent_only
        timer = None if deadline is None else loop.call_at(deadline, _release, waiter)
        try:
            await waiter
        finally:
            if self._waiter is waiter:  # not released by a put (the deadline, a cancellation)
                self._waiter = None
            if timer is not None:
                timer.cancel()


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
