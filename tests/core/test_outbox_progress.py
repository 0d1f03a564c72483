"""A model test of the outbound queue: whatever the lanes, queue bound, batch size and reader
pauses, a batching writer takes every event, in each lane's order, and never wedges.

Each lane's producer behaves as a run does: deltas, then ``hold`` (an engine segment ended),
its done events, a pause for post-inference, its terminal event, then ``release`` (the run's
task ended). The reader takes batches and yields to the loop between them as a slow client's
writes would. A wedge (the writer waiting for a held step whose last event cannot be put)
shows as every task blocked: the run's bounded wait then fails.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from bidi_responses.schema import ServerEvent
from bidi_responses.server.core.lanes.outbound import Outbox
from bidi_responses.server.core.runs.record import OutEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(120)


def _event(lane: str, kind: str, seq: int, **extra: Any) -> OutEvent:
    return OutEvent(lane, cast(ServerEvent, {"type": kind, "sequence_number": seq, **extra}))


async def _yield(times: int) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


async def _produce(
    box: Outbox, lane: str, responses: int, deltas: int, post_yields: int
) -> list[int]:
    """One lane's runs, one after another; the sequence numbers it put, in order."""
    put: list[int] = []
    seq = 0
    for _ in range(responses):
        for _ in range(deltas):
            seq += 1
            await box.put(
                _event(
                    lane,
                    "response.output_text.delta",
                    seq,
                    item_id=f"msg_{seq}",  # never merged: each delta is counted
                    output_index=0,
                    content_index=0,
                    delta="x",
                )
            )
            put.append(seq)
        box.hold(lane)
        for kind in ("response.output_text.done", "response.output_item.done"):
            seq += 1
            await box.put(_event(lane, kind, seq))
            put.append(seq)
        await _yield(post_yields)  # post-inference makes the response durable
        seq += 1
        await box.put(_event(lane, "response.completed", seq))
        put.append(seq)
        box.release(lane)  # the run's task ended
    return put


async def _drain(
    box: Outbox, max_events: int, pauses: list[int], received: dict[str, list[int]]
) -> None:
    n = 0
    while True:
        batch = await box.take(max_events)
        assert 0 < len(batch) <= max_events
        for out in batch:
            if out is None:
                return
            received.setdefault(out.lane, []).append(cast(Any, out.data)["sequence_number"])
        await _yield(pauses[n % len(pauses)])  # the client's socket drains
        n += 1


async def _run(
    lanes: int,
    responses: int,
    deltas: int,
    maxsize: int,
    max_events: int,
    pauses: list[int],
    post_yields: int,
) -> None:
    box = Outbox(maxsize, merge=False)
    received: dict[str, list[int]] = {}
    reader = asyncio.create_task(_drain(box, max_events, pauses, received))
    producers = [
        asyncio.create_task(_produce(box, f"lane-{n}", responses, deltas, post_yields))
        for n in range(lanes)
    ]
    # A bound, not a synchronization: without a wedge this takes milliseconds.
    async with asyncio.timeout(10):
        sent = await asyncio.gather(*producers)
        await box.put(None)
        await reader
    for n, put in enumerate(sent):
        assert received.get(f"lane-{n}", []) == put


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lanes=st.integers(1, 12),
    responses=st.integers(1, 3),
    deltas=st.integers(0, 12),
    maxsize=st.integers(1, 24),
    max_events=st.integers(1, 16),
    pauses=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    post_yields=st.integers(0, 3),
)
def test_every_event_is_taken_in_lane_order(
    lanes: int,
    responses: int,
    deltas: int,
    maxsize: int,
    max_events: int,
    pauses: list[int],
    post_yields: int,
) -> None:
    asyncio.run(_run(lanes, responses, deltas, maxsize, max_events, pauses, post_yields))


async def test_a_full_queue_is_taken_though_its_first_lane_is_held() -> None:
    """The case behind the wedge, by hand: the queue is full, the first event's lane is held,
    and the rest of its step waits to be put behind it; the writer takes what is there, and
    the step's end follows."""
    box = Outbox(3, merge=False)
    box.hold("a")
    for seq in range(3):
        box.put_nowait(_event("a", "response.output_item.done", seq))

    async def rest_of_step() -> None:
        await box.put(_event("a", "response.output_item.done", 3))  # fills the queue again
        await box.put(_event("a", "response.completed", 4))

    ending = asyncio.create_task(rest_of_step())
    seqs: list[int] = []
    async with asyncio.timeout(5):
        while len(seqs) < 5:
            batch = await box.take(8)
            seqs += [cast(Any, out.data)["sequence_number"] for out in batch if out is not None]
        await ending
    assert seqs == [0, 1, 2, 3, 4]
