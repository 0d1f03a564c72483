"""The project's client on lanes: creates on a busy lane wait their turn, lanes run side by
side, and a create may continue (fork) a response of another lane."""

from __future__ import annotations

import asyncio

from bidi_responses.server.app import RunningServer

from tests.conftest import ServerFactory
from tests.grpc.conftest import open_stream


async def test_creates_on_a_busy_lane_wait_their_turn(server_factory: ServerFactory) -> None:
    running: RunningServer = await server_factory(tokens_per_second=2000, answer_tokens=20)
    async with asyncio.timeout(30), open_stream(running) as stream:
        turns = await asyncio.gather(
            *(stream.create(model="sim-model", input=f"turn {i}", stream_id="a") for i in range(3))
        )
        assert [t.status for t in turns] == ["completed"] * 3
        assert len({t.id for t in turns}) == 3
        # Each turn ran after the previous one ended: none overlapped on the lane.
        ends = [t.raw["completed_at"] for t in turns]
        assert ends == sorted(ends)
