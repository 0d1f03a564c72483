"""The simulated engine's shared clock (``StepClock``) on a real event loop: sleeps end no
sooner than asked, those ending in one step share one timer, and a cancelled sleeper leaves
the others to wake."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from bidi_responses.server.engines.timing import STEP_S, StepClock

TIMEOUT_S = 5.0


def _count_timers(loop: asyncio.AbstractEventLoop) -> list[float]:
    """Record when each timer the step clock asks the loop for is due."""
    due: list[float] = []
    call_at: Callable[..., asyncio.TimerHandle] = loop.call_at

    def counted(when: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        if getattr(callback, "__func__", None) is StepClock._release:
            due.append(when)
        return call_at(when, callback, *args)

    loop.call_at = counted  # type: ignore[assignment, method-assign]
    return due


async def test_sleeps_ending_in_one_step_share_one_timer_and_none_ends_early() -> None:
    loop = asyncio.get_running_loop()
    clock = StepClock.of_running_loop()
    timers = _count_timers(loop)
    start = loop.time()
    # A step boundary 200 ms ahead (far enough that a loaded machine still starts every sleep
    # before its end); ten sleeps ending inside the step before it.
    boundary = (int((start + 0.2) / STEP_S) + 1) * STEP_S
    ends = [boundary - STEP_S * (0.1 + 0.08 * i) for i in range(10)]

    async def sleeper(end: float) -> float:
        await clock.sleep(end - loop.time())
        return loop.time() - end

    async with asyncio.timeout(TIMEOUT_S):
        lateness = await asyncio.gather(*(sleeper(end) for end in ends))
    assert min(lateness) >= 0  # never before its time
    assert timers == [pytest.approx(boundary)]


async def test_sleeps_in_different_steps_wake_in_order() -> None:
    clock = StepClock.of_running_loop()
    woke: list[int] = []

    async def sleeper(n: int) -> None:
        await clock.sleep(0.002 * (n + 1))
        woke.append(n)

    async with asyncio.timeout(TIMEOUT_S):
        await asyncio.gather(*(sleeper(n) for n in (3, 0, 2, 1)))
    assert woke == [0, 1, 2, 3]


async def test_a_cancelled_sleeper_leaves_the_rest_of_its_step_to_wake() -> None:
    clock = StepClock.of_running_loop()
    cancelled = asyncio.create_task(clock.sleep(0.005))
    kept = asyncio.create_task(clock.sleep(0.005))
    await asyncio.sleep(0)  # both wait now, in the same step
    cancelled.cancel()
    async with asyncio.timeout(TIMEOUT_S):
        await kept
    with pytest.raises(asyncio.CancelledError):
        await cancelled


async def test_each_loop_has_its_own_clock() -> None:
    here = StepClock.of_running_loop()
    assert StepClock.of_running_loop() is here

    def elsewhere() -> StepClock:
        async def get() -> StepClock:
            return StepClock.of_running_loop()

        return asyncio.run(get())

    assert await asyncio.to_thread(elsewhere) is not here
