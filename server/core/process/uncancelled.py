"""Cleanup that a cancellation cannot cut short.

A stream's handler is cancelled whenever its client goes away, and that can happen while the
handler is already cleaning up after an error (a client that reads an error event and cancels
at once). Cleanup that stops half way leaks what it was releasing: a session counted open with
no connection behind it, a tenant refused for streams it no longer has. ``uncancelled`` runs
such cleanup to its end and lets the cancellation take effect afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def uncancelled(work: Awaitable[T]) -> T:
    """Await ``work`` to its end; a cancellation meanwhile (even repeated) is raised once it
    has ended. ``work``'s own result or exception is returned or raised otherwise."""
    running = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        if running.cancelled():
            raise  # the work itself was cancelled (a loop shutting down)
        while not running.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait((running,))
        raise
