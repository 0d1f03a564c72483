"""No Connect stream wedges: many lanes of long answers to a client that reads steadily, but
slower than the engine writes, all finish.

The outbound queue fills (the reader is slow), every producer waits to put, and a batching
writer must never wait for a held lane's step to end while the step's last event cannot be put.
A small queue makes the full-queue case come at once instead of after minutes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from bidi_responses.codec import params_to_pb, unbatch
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from tests.conftest import ServerFactory, make_config

pytestmark = pytest.mark.timeout(90)

_TERMINAL = {"response_completed", "response_failed", "response_incomplete", "error"}


async def _slow_reader_run(
    server_factory: ServerFactory,
    tmp_path: Path,
    *,
    lanes: int,
    per_lane: int,
    batch: bool,
    pause_s: float,
    queue_events: int,
    answer_tokens: int = 400,
) -> tuple[int, int]:
    """Send ``per_lane`` creates on each of ``lanes`` lanes at once, read with a pause per
    message; the terminal events seen and the terminal events expected."""
    config = make_config(
        tmp_path, tokens_per_second=4_000, answer_tokens=answer_tokens, tool_rounds=0
    )
    config.limits.outbound_queue_events = queue_events
    config.limits.write_timeout_s = 60.0
    running = await server_factory(config)
    expected = lanes * per_lane
    queue: asyncio.Queue[pb.ConnectRequest | None] = asyncio.Queue()
    first = True
    for n in range(per_lane):
        for lane in range(lanes):
            request = pb.ConnectRequest(
                stream_id=f"lane-{lane}",
                response_create=params_to_pb(
                    {"model": "sim-model", "input": f"essay {n}", "store": False}
                ),
            )
            if first and batch:
                request.delivery.batch_events = True
            first = False
            queue.put_nowait(request)

    async def requests() -> AsyncIterator[pb.ConnectRequest]:
        while (item := await queue.get()) is not None:
            yield item

    terminals = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
        call = pb_grpc.ResponsesServiceStub(channel).Connect(requests())
        async for message in call:
            for event in unbatch(message):
                if event.WhichOneof("event") in _TERMINAL:
                    terminals += 1
            if terminals == expected:
                queue.put_nowait(None)
            await asyncio.sleep(pause_s)  # the client's own pace, not a synchronization
        assert await call.code() == grpc.StatusCode.OK, await call.details()
    return terminals, expected


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "unbatched"])
async def test_slow_reader_on_many_lanes_gets_every_answer(
    server_factory: ServerFactory, tmp_path: Path, batch: bool
) -> None:
    async with asyncio.timeout(80):
        seen, expected = await _slow_reader_run(
            server_factory,
            tmp_path,
            lanes=12,
            per_lane=2,
            batch=batch,
            pause_s=0.002,
            queue_events=16,
        )
    assert seen == expected


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("batch", "pause_s"), [(True, 0.010), (False, 0.002)], ids=["batched", "unbatched"]
)
async def test_the_reported_wedge_32_lanes_of_long_answers(
    server_factory: ServerFactory, tmp_path: Path, batch: bool, pause_s: float
) -> None:
    """The case as it was found: 32 lanes x 4 answers of 2,000 tokens at 4,000 tok/s, the
    default queue of 512 events, a client pausing per message."""
    async with asyncio.timeout(580):
        seen, expected = await _slow_reader_run(
            server_factory,
            tmp_path,
            lanes=32,
            per_lane=4,
            batch=batch,
            pause_s=pause_s,
            queue_events=512,
            answer_tokens=2_000,
        )
    print(f"\n32 lanes x 4 long answers, {'batched' if batch else 'unbatched'}: {seen}/{expected}")
    assert seen == expected
