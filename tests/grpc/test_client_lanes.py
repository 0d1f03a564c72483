"""The project's client on lanes: creates on a busy lane wait their turn, lanes run side by
side, and a create may continue (fork) a response of another lane."""

from __future__ import annotations

import asyncio

from bidi_responses.client import Response
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


async def test_the_lane_helper_follows_a_steered_chain_to_its_end(
    server_factory: ServerFactory,
) -> None:
    """``stream.lane(...)``: creates take turns; ``final_response`` is the response itself
    when nothing steered it, and the automatic successor when something did."""
    running: RunningServer = await server_factory(
        tokens_per_second=400, answer_tokens=40, ttft_ms=1000
    )
    async with asyncio.timeout(30), open_stream(running) as stream:
        lane = stream.lane("a")
        plain = await lane.create(model="sim-model", input="hello", store=False)
        assert (await lane.final_response()).id == plain.id  # not steered: itself, at once
        target = ""
        async for event in lane.create_events(model="sim-model", input="a long story"):
            if event["type"] == "response.created":
                target = event["response"]["id"]
                assert (await lane.steer(previous_response_id=target, input="short")).accepted
        with_steering = Response.from_dict(event["response"])
        assert with_steering.id == target and with_steering.steered
        final = await lane.final_response(with_steering)
        assert final.previous_response_id == target and final.status == "completed"
        # A fork on another lane continues the successor from the stream's one cache.
        fork = await stream.lane("b").create(
            model="sim-model", input="and?", previous_response_id=final.id, store=False
        )
        assert fork.status == "completed" and fork.previous_response_id == final.id
