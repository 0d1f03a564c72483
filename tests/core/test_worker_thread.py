"""``in_worker_thread``: a cancelled awaiter goes on only once its thread has returned, so it
never unwinds while the thread still writes the state it handed over."""

from __future__ import annotations

import asyncio
import threading

import pytest
from bidi_responses.server.core.ports import in_worker_thread

TIMEOUT_S = 20


class _Blocking:
    """Work that writes ``written`` only when the test releases it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.written: list[str] = []

    def __call__(self, value: str) -> str:
        self.started.set()
        if not self.release.wait(TIMEOUT_S):
            raise TimeoutError("never released")
        self.written.append(value)
        return value


async def _turns(count: int) -> None:
    """Let the loop run ``count`` times: what a cancellation needs to reach its task."""
    for _ in range(count):
        await asyncio.sleep(0)


async def test_the_result_comes_back_from_another_thread() -> None:
    async with asyncio.timeout(TIMEOUT_S):
        assert await in_worker_thread(lambda: threading.current_thread()) is not (
            threading.current_thread()
        )


@pytest.mark.parametrize("cancels", [1, 2])
async def test_a_cancelled_awaiter_ends_only_after_its_thread(cancels: int) -> None:
    work = _Blocking()
    async with asyncio.timeout(TIMEOUT_S):
        task = asyncio.create_task(in_worker_thread(work, "tokens"))
        await asyncio.to_thread(work.started.wait, TIMEOUT_S)
        for _ in range(cancels):  # a stop after a client's cancel waits as well
            task.cancel()
            await _turns(20)
        # asyncio.to_thread alone would have ended the task here, the work still running.
        assert not task.done() and work.written == []
        work.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert work.written == ["tokens"]
