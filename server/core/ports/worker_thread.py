"""Work in a worker thread that always ends before the task awaiting it goes on.

A thread cannot be stopped. When the task that awaits ``asyncio.to_thread`` is cancelled (its
stream went away, or the client cancelled the response), the await raises at once while the
thread goes on writing what it was handed: a conversation's tokens, a stage's carried state.
The cancelled task would then unwind (its terminal event, its ledger row, the stored state)
reading that state half written. Here the cancellation waits for the thread instead. The work
that takes this path is bounded (``max_item_chars``, ``max_request_chars``), so the
cancellation is late by at most that work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from ..process.uncancelled import uncancelled

P = ParamSpec("P")
T = TypeVar("T")


async def off_loop_from(
    size: int, threshold: int, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """``work(*args, **kwargs)``: inline when ``size`` is under ``threshold`` (a thread hop
    costs more than small work), else ``in_worker_thread``."""
    if size < threshold:
        return work(*args, **kwargs)
    return await in_worker_thread(work, *args, **kwargs)


async def in_worker_thread(work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``await asyncio.to_thread(work, ...)``, except that a cancellation takes effect only
    once the thread has returned."""
    # A second cancellation (a stop after a client's cancel) waits as well.
    return await uncancelled(asyncio.to_thread(work, *args, **kwargs))
