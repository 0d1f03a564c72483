"""asyncio's ``Queue`` and ``Event``, and a deque, without a deque's eager block.

Every open stream holds a few queues and events (its outbound queue, the WebSocket protocol's
inbox, their wake-ups) and a queue per lane. A ``collections.deque`` allocates a block of 64
slots up front, ~760 bytes, even empty; a list grows from 56. These hold a handful of entries
at a time (a queue holds at most its bound), so a list whose ``popleft`` shifts the rest costs
nothing measurable and keeps an idle stream ~8 KiB smaller (``make stream-memory``).

``LeanQueue`` and ``LeanEvent`` are asyncio's own classes whose deques are swapped for
``SmallDeque`` after they are built: asyncio keeps waiters in ``_getters``, ``_putters`` and
``_waiters`` and items in ``_queue``, and uses only ``append``, ``popleft``, ``remove``,
indexing, ``len`` and iteration on them, all of which a list has (``popleft`` added here).
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

__all__ = ["LeanEvent", "LeanQueue", "SmallDeque"]

T = TypeVar("T")


class SmallDeque(list[T]):
    """The part of ``collections.deque``'s interface that short queues use, on a list."""

    __slots__ = ()

    def popleft(self) -> T:
        return self.pop(0)

    def appendleft(self, item: T) -> None:
        self.insert(0, item)


class LeanEvent(asyncio.Event):
    """An ``asyncio.Event`` whose waiters are kept in a list."""

    def __init__(self) -> None:
        super().__init__()
        self._waiters: SmallDeque[asyncio.Future[bool]] = SmallDeque()  # type: ignore[assignment]


class LeanQueue(asyncio.Queue[T]):
    """An ``asyncio.Queue`` whose items and waiters are kept in lists."""

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self._getters: SmallDeque[asyncio.Future[None]] = SmallDeque()
        self._putters: SmallDeque[asyncio.Future[None]] = SmallDeque()
        self._finished = LeanEvent()
        self._finished.set()

    def _init(self, maxsize: int) -> None:
        self._queue: SmallDeque[T] = SmallDeque()
