"""What the server has open (streams and one-shot creates), so that it knows when it is idle:
the idle trimmer returns memory then, and ``wait_until_idle`` wakes."""

from __future__ import annotations

import asyncio
from collections.abc import Sized
from typing import Protocol

from .malloc_trim import IdleTrimmer


class Running(Protocol):
    """The responses the server has in flight (``runs.deps.ServerState``)."""

    @property
    def inflight(self) -> Sized:
        """The in-flight responses."""


class Activity:
    """A count of what is open, and a way to wait until nothing is (or runs)."""

    def __init__(self, trimmer: IdleTrimmer, state: Running) -> None:
        self._trimmer = trimmer
        self._state = state
        self._open = 0
        self._changed = asyncio.Condition()

    @property
    def idle(self) -> bool:
        """Nothing is open and no response is in flight."""
        return not self._open and not self._state.inflight

    def begin(self) -> None:
        """A stream or one-shot create opened."""
        self._open += 1
        self._trimmer.busy()

    async def end(self) -> None:
        """One of them ended."""
        self._open -= 1
        if not self._open:
            self._trimmer.idle(lambda: self.idle)
        async with self._changed:
            self._changed.notify_all()

    async def wait_until_idle(self) -> None:
        """Wait until nothing is open and no response is in flight."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.idle)
