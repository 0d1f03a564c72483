"""The one write-timeout mechanism: a client that stopped reading is cut off.

A write waits while flow control (HTTP/2 windows, a socket's buffer) says the client's side is
full. One watch per stream notes when the pending write began and wakes a few times per
timeout, which costs far less than a timer per write (an ``asyncio.timeout`` per delta was
measured at ~10% of the server's CPU at saturation). A write pending for the whole timeout
cancels the writer, is counted once (``write_timeouts_total``), and the transport ends the
stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from ...core.api import ApiError
from ...core.observability import Counters


def write_timeout_error(seconds: float) -> ApiError:
    """The status of a stream cut off because its client stopped reading."""
    # Only the time one message waited is known: the client may have been reading, but more
    # slowly than the stream produced (everything ahead of the message had to drain first).
    return ApiError(
        f"A message to this client waited {seconds:g} s to be sent (write timeout): the client "
        "read more slowly than the stream produced its events, or stopped reading, so the "
        "stream was closed and its in-flight responses cancelled.",
        code="write_timeout",
        status=429,
        type="server_error",
    )


class WriteWatch:
    """When the pending write of one stream began; ``stalled`` returns once a write has been
    pending for the timeout. The writer calls ``begin`` and ``end`` around each write."""

    __slots__ = ("_clock", "started", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._clock = asyncio.get_running_loop().time
        # When the pending write began (None: none pending), on the event loop's clock.
        self.started: float | None = None

    def begin(self) -> None:
        self.started = self._clock()

    def end(self) -> None:
        self.started = None

    async def stalled(self) -> None:
        """Return once a write has been pending for the write timeout (never, with none)."""
        if self.timeout <= 0:
            await asyncio.get_running_loop().create_future()  # no timeout configured
        while True:
            started = self.started
            wait = self.timeout / 4
            if started is not None:
                wait = min(wait, started + self.timeout - self._clock())
                if wait <= 0:
                    return
            await asyncio.sleep(wait)


Writes = Callable[[WriteWatch], Coroutine[Any, Any, None]]


class WatchedWrites:
    """A stream's writer task and the watch over its writes."""

    def __init__(self, writes: Writes, timeout: float, counters: Counters, name: str) -> None:
        self.timeout = timeout
        self._counters = counters
        watch = WriteWatch(timeout)
        loop = asyncio.get_running_loop()
        self.writer = loop.create_task(writes(watch), name=name)
        self.watch = loop.create_task(watch.stalled(), name=f"{name}-watch")

    @property
    def tasks(self) -> tuple[asyncio.Task[None], asyncio.Task[None]]:
        return self.writer, self.watch

    async def cut_off(self) -> None:
        """The watch fired: stop the writer (its pending write is dropped) and count it."""
        self._counters.write_timeouts += 1
        await self.stop()

    async def stop(self) -> None:
        """Cancel the writer and the watch (however they ended) and wait for them."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def wait(self) -> bool:
        """Wait for the writer to finish (its exception raised) or the watch to fire (the
        writer is then cut off); True if it was cut off. Both are stopped either way."""
        try:
            await asyncio.wait(self.tasks, return_when=asyncio.FIRST_COMPLETED)
            if self.watch.done():
                await self.cut_off()
                return True
            self.writer.result()
            return False
        finally:
            await self.stop()
