"""The stateful Connect stream: cache reuse, semantics of the hosted WebSocket mode, store."""

from __future__ import annotations

import asyncio
import itertools
import statistics
from typing import Any

import pytest
from bidi_responses.client import (
    AsyncResponsesClient,
    FunctionCallItem,
    FunctionCallOutputItem,
    Response,
    ResponsesError,
)
from bidi_responses.codec import params_to_pb
from bidi_responses.schema import JSONMapping
from bidi_responses.server.app import RunningServer
from bidi_responses.v1 import responses_pb2 as pb

from tests.conftest import SHELL_TOOL, ServerFactory, collect_until_terminal, make_config
from tests.grpc.conftest import open_stream, start_create
from tests.workload import tool_output

INSTRUCTIONS = "You are a coding agent. Use exec_command to inspect and fix the repository."


def _output_for(call: FunctionCallItem, turn: int, tokens: int = 2000) -> FunctionCallOutputItem:
    return {
        "type": "function_call_output",
        "call_id": call["call_id"],
        "output": tool_output(tokens, seed=turn),
    }


async def test_25_turn_loop_renders_only_new_input(server_factory: ServerFactory) -> None:
    """Stateful: tokens rendered per turn stay flat and cached_tokens grows; stateless: the
    whole history is rendered every turn."""
    running = await server_factory(tool_rounds=30)
    async with (
        asyncio.timeout(90),
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
    ):
        stateful = []
        async with client.connect() as stream:
            response = await stream.create(
                model="sim-model",
                instructions=INSTRUCTIONS,
                input="Fix the failing test.",
                tools=[SHELL_TOOL],
                store=False,
            )
            stateful.append(response)
            for turn in range(1, 25):
                response = await stream.create(
                    model="sim-model",
                    instructions=INSTRUCTIONS,
                    tools=[SHELL_TOOL],
                    previous_response_id=response.id,
                    store=False,
                    input=[_output_for(response.function_calls[0], turn)],
                )
                stateful.append(response)

        history: list[JSONMapping] = [
            {"type": "message", "role": "user", "content": "Fix the failing test."}
        ]
        stateless: list[Response] = []
        for turn in range(25):
            if stateless:  # the whole history again, with the last output and its tool result
                last = stateless[-1]
                history = [*history, *last.output, _output_for(last.function_calls[0], turn)]
            stateless.append(
                await client.create(
                    model="sim-model",
                    instructions=INSTRUCTIONS,
                    input=history,
                    tools=[SHELL_TOOL],
                    store=False,
                )
            )

    assert len(stateful) == len(stateless) == 25
    rendered = [r.stats["tokens_rendered"] for r in stateful]
    cached = [r.usage.cached_tokens for r in stateful if r.usage]
    later = rendered[1:]
    median = statistics.median(later)
    # New input only: every continuation renders about one tool output (~2k tokens) plus the
    # previous turn's small output, whatever the history length.
    assert all(0.8 * median <= n <= 1.2 * median for n in later), rendered
    assert 1800 < median < 3000
    assert cached[0] == 0 and all(b > a for a, b in itertools.pairwise(cached[1:]))
    assert stateful[-1].usage is not None and stateful[-1].usage.input_tokens > 45_000
    assert all(r.stats["items_validated"] == 1 for r in stateful[1:])

    full = [r.stats["tokens_rendered"] for r in stateless]
    assert all(b > a for a, b in itertools.pairwise(full))
    assert full[-1] > 20 * full[1] // 2
    # Both paths see the same prompt: the incremental render equals the full render.
    assert [r.usage.input_tokens for r in stateful if r.usage] == [
        r.usage.input_tokens for r in stateless if r.usage
    ]
    assert all(r.usage is not None and r.usage.cached_tokens == 0 for r in stateless)
    assert [r.stats["items_validated"] for r in stateless][-1] == len(history)


async def test_unknown_previous_response_id_keeps_stream_usable(
    client: AsyncResponsesClient,
) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        with pytest.raises(ResponsesError) as caught:
            await stream.create(model="sim-model", input="hi", previous_response_id="resp_nope")
        assert caught.value.code == "previous_response_not_found"
        assert caught.value.param == "previous_response_id"
        ok = await stream.create(model="sim-model", input="hi")
        assert ok.status == "completed" and ok.output_text


async def test_failed_continuation_evicts_what_it_referenced(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        first = await stream.create(model="sim-model", input="go", tools=[SHELL_TOOL], store=False)
        with pytest.raises(ResponsesError) as caught:
            await stream.create(
                model="sim-model",
                previous_response_id=first.id,
                store=False,
                input=[{"type": "function_call_output", "call_id": "call_bogus", "output": "x"}],
                tools=[SHELL_TOOL],
            )
        assert caught.value.param == "input[0].call_id"
        with pytest.raises(ResponsesError) as again:
            await stream.create(
                model="sim-model",
                previous_response_id=first.id,
                store=False,
                input="retry",
                tools=[SHELL_TOOL],
            )
        assert again.value.code == "previous_response_not_found"


async def test_cache_keeps_only_the_most_recent_response_by_default(
    client: AsyncResponsesClient,
) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        first = await stream.create(model="sim-model", input="one", store=False)
        await stream.create(model="sim-model", input="two", store=False)
        with pytest.raises(ResponsesError) as caught:
            await stream.create(
                model="sim-model", input="three", store=False, previous_response_id=first.id
            )
        assert caught.value.code == "previous_response_not_found"


async def test_cache_size_is_configurable(server_factory: ServerFactory, tmp_path: Any) -> None:
    config = make_config(tmp_path)
    config.cache.max_responses = 2
    running = await server_factory(config)
    async with asyncio.timeout(20), open_stream(running) as stream:
        first = await stream.create(model="sim-model", input="one", store=False)
        await stream.create(model="sim-model", input="two", store=False)
        third = await stream.create(
            model="sim-model", input="three", store=False, previous_response_id=first.id
        )
        assert third.usage is not None and third.usage.cached_tokens > 0


async def test_second_create_while_one_is_in_flight_waits_its_turn(
    server_factory: ServerFactory,
) -> None:
    running: RunningServer = await server_factory(tokens_per_second=200, answer_tokens=40)
    async with asyncio.timeout(30), open_stream(running) as stream:
        events, created = await start_create(stream, "first")
        assert created["type"] == "response.created"
        await stream.send(
            pb.ConnectRequest(
                response_create=params_to_pb({"model": "sim-model", "input": "second"})
            )
        )
        rest = []
        async for event in events:
            rest.append(event)
            if (
                event["type"] == "response.completed"
                and len(rest) > 1
                and (event["response"]["id"] != created["response"]["id"])
            ):
                break
        kinds = [e["type"] for e in rest]
        assert "error" not in kinds
        # In order, without overlap: the second is created after the first's terminal event.
        first_end = kinds.index("response.completed")
        assert rest[first_end]["response"]["id"] == created["response"]["id"]
        assert kinds[first_end + 1] == "response.created"
        assert rest[-1]["response"]["output"][0]["content"][0]["text"]


async def test_generate_false_warms_the_cache(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        warm = await stream.create(
            model="sim-model",
            instructions=INSTRUCTIONS,
            tools=[SHELL_TOOL],
            input="base instructions",
            generate=False,
            store=False,
        )
        assert warm.status == "completed" and warm.output == []
        assert warm.stats["engine_runs"] == 0
        assert warm.usage is not None and warm.usage.output_tokens == 0
        turn = await stream.create(
            model="sim-model",
            instructions=INSTRUCTIONS,
            tools=[SHELL_TOOL],
            input="now do it",
            previous_response_id=warm.id,
            store=False,
        )
        assert turn.usage is not None
        assert turn.usage.cached_tokens == warm.usage.input_tokens
        assert turn.stats["route_resolved"] is False


async def test_lanes_run_in_parallel_and_echo_their_stream_id(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        results = await asyncio.gather(
            *[
                stream.create(
                    stream_id=f"agent-{i}",
                    model="sim-model",
                    input=f"task {i}",
                    tools=[SHELL_TOOL],
                    store=False,
                )
                for i in range(4)
            ]
        )
        # One cache serves the stream's lanes: lane 0 forks lane 1's (unstored) response,
        # and lane 1 keeps it.
        fork = await stream.create(
            stream_id="agent-0",
            model="sim-model",
            tools=[SHELL_TOOL],
            input=[results[1].call_output("forked")],
            previous_response_id=results[1].id,
            store=False,
        )
        assert fork.previous_response_id == results[1].id
        assert fork.usage is not None and fork.usage.cached_tokens > 0
        source = await stream.create(
            stream_id="agent-1",
            model="sim-model",
            tools=[SHELL_TOOL],
            input=[results[1].call_output("ok")],
            previous_response_id=results[1].id,
            store=False,
        )
        assert source.usage is not None and source.usage.cached_tokens > 0
        follow = await stream.create(
            stream_id="agent-2",
            model="sim-model",
            previous_response_id=results[2].id,
            store=False,
            tools=[SHELL_TOOL],
            input=[results[2].call_output("ok")],
        )
        assert follow.usage is not None and follow.usage.cached_tokens > 0


async def test_events_echo_the_lane(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        events = [
            e
            async for e in stream.create_events(
                stream_id="lane-7", model="sim-model", input="hi", store=False
            )
        ]
        assert events and all(e.get("stream_id") == "lane-7" for e in events)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        types = [e["type"] for e in events]
        assert types[:2] == ["response.created", "response.in_progress"]
        assert types[-1] == "response.completed"
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert text == events[-1]["response"]["output"][0]["content"][0]["text"]


async def test_store_lets_another_stream_and_a_restarted_server_continue(
    server_factory: ServerFactory, tmp_path: Any
) -> None:
    config = make_config(tmp_path)
    running = await server_factory(config)
    async with asyncio.timeout(30):
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client:
            async with client.connect() as stream:
                first = await stream.create(
                    model="sim-model", input="remember 42", tools=[SHELL_TOOL]
                )
                second = await stream.create(
                    model="sim-model",
                    previous_response_id=first.id,
                    tools=[SHELL_TOOL],
                    input=[first.call_output("42")],
                )
            async with client.connect() as other:
                third = await other.create(
                    model="sim-model",
                    input="and then?",
                    previous_response_id=second.id,
                    tools=[SHELL_TOOL],
                )
            # Not from a cache: the history came from the store and was processed again.
            assert third.stats["tokens_reused"] == 0
            assert third.stats["items_validated"] == 5
            assert third.usage is not None and second.usage is not None
            assert third.usage.input_tokens > second.usage.input_tokens
        await running.stop(grace=0)

        restarted = await server_factory(make_config(tmp_path))
        async with AsyncResponsesClient(f"127.0.0.1:{restarted.grpc_port}") as client:
            stored = await client.get(third.id)
            assert stored.status == "completed" and stored.previous_response_id == second.id
            async with client.connect() as stream:
                fourth = await stream.create(
                    model="sim-model",
                    input="continue",
                    previous_response_id=third.id,
                    tools=[SHELL_TOOL],
                )
            assert fourth.status == "completed"


async def test_cancel_stops_an_in_flight_response(server_factory: ServerFactory) -> None:
    # At 2 tokens/s the answer would take minutes; the test's timeout proves cancellation.
    running = await server_factory(tokens_per_second=2, answer_tokens=400)
    async with asyncio.timeout(15), open_stream(running) as stream:
        events, created = await start_create(stream, "long answer")
        await stream.cancel(created["response"]["id"])
        rest = await collect_until_terminal(events)
        assert rest[-1]["type"] == "response.incomplete"
        assert rest[-1]["response"]["status"] == "cancelled"
        assert rest[-1]["response"]["incomplete_details"] == {"reason": "cancelled"}
        again = await stream.create(model="sim-model", input="still usable?", generate=False)
        assert again.status == "completed"


async def test_client_going_away_aborts_engine_work(server_factory: ServerFactory) -> None:
    running = await server_factory(tokens_per_second=2, answer_tokens=400)
    async with (
        asyncio.timeout(15),
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
    ):
        async with client.connect() as stream:
            await start_create(stream, "long")
            assert len(running.core.deps.state.inflight) == 1
            stream.abort()
        await running.core.wait_until_idle()
        stats = await client.stats()
        assert stats["streams_open"] == 0
