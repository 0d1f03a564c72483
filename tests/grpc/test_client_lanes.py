"""The project's client on lanes: creates on a busy lane wait their turn, lanes run side by
side, a create may continue (fork) a response of another lane, and a consumer that stops
reading a turn's events early leaves the lane usable, whether it stops at the terminal event
(the README's loop) or before it."""

from __future__ import annotations

import asyncio

from bidi_responses.client import AsyncResponsesClient, Response
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
        ends: list[int] = []
        for turn in turns:
            end = turn.raw["completed_at"]
            assert end is not None
            ends.append(end)
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


async def test_breaking_out_at_the_terminal_event_leaves_the_lane_free(
    client: AsyncResponsesClient,
) -> None:
    """The loop the README shows for the openai SDK, here on a Connect stream: it raised
    "lane '' already has a response in flight" on the second turn."""
    async with asyncio.timeout(20), client.connect() as stream:
        previous = None
        for turn in range(3):
            async for event in stream.create_events(
                model="sim-model", input=f"turn {turn}", previous_response_id=previous
            ):
                if event["type"] == "response.completed":
                    previous = event["response"]["id"]
                    break
            assert previous is not None
        response = await stream.create(
            model="sim-model", input="last", previous_response_id=previous
        )
        assert response.status == "completed"


async def test_after_breaking_out_early_the_next_turn_reads_the_rest_first(
    server_factory: ServerFactory,
) -> None:
    # 200 tokens/s for a 200-token answer: the response is in flight when the loop breaks.
    running: RunningServer = await server_factory(tokens_per_second=200, answer_tokens=200)
    async with (
        asyncio.timeout(30),
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
        client.connect() as stream,
    ):
        abandoned = None
        async for event in stream.create_events(model="sim-model", input="long", store=False):
            if event["type"] == "response.created":
                abandoned = event["response"]["id"]
                break
        assert abandoned is not None
        # The lane's next turn waits for the abandoned one to end, then gets its own events.
        response = await stream.create(model="sim-model", input="next", store=False)
        assert response.status == "completed" and response.id != abandoned
        # Breaking early after a cancel: the response stops, and the lane is free again.
        async for event in stream.create_events(model="sim-model", input="long", store=False):
            if event["type"] == "response.created":
                await stream.cancel(event["response"]["id"])
                break
        again = await stream.create(model="sim-model", input="again", store=False)
        assert again.status == "completed"


async def test_a_consumer_that_closes_early_can_read_the_rest_itself(
    server_factory: ServerFactory,
) -> None:
    running: RunningServer = await server_factory(tokens_per_second=200, answer_tokens=200)
    async with (
        asyncio.timeout(30),
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
        client.connect() as stream,
    ):
        events = stream.create_events(model="sim-model", input="long", store=False)
        created = await anext(events)
        assert created["type"] == "response.created"
        await events.aclose()
        await stream.cancel(created["response"]["id"])
        async for event in stream.events():
            if event["type"] == "response.incomplete":
                assert event["response"]["id"] == created["response"]["id"]
                break
        response = await stream.create(model="sim-model", input="next", store=False)
        assert response.status == "completed"


async def test_a_turn_left_in_one_task_frees_the_lane_for_another(
    client: AsyncResponsesClient,
) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        left = asyncio.Event()

        async def reader() -> None:
            async for _ in stream.create_events(model="sim-model", input="one"):
                break  # asyncio closes the dropped generator later, in a task of its own
            left.set()

        async def next_turn() -> str:
            await left.wait()
            return (await stream.create(model="sim-model", input="two")).status

        _, status = await asyncio.gather(reader(), next_turn())
        assert status == "completed"
