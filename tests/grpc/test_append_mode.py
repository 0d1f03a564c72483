"""Prototype shape: one long-running response, paused by response.done, fed by append."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from bidi_responses.client import (
    AsyncResponsesClient,
    FunctionCallItem,
    FunctionCallOutputItem,
    ResponsesError,
    run_agent_loop,
)
from bidi_responses.codec import item_to_pb
from bidi_responses.v1 import responses_pb2 as pb

from tests.conftest import SHELL_TOOL, ServerFactory, collect_until_terminal, make_config
from tests.grpc.conftest import open_stream, pause_for_tool_outputs


def _outputs(calls: list[FunctionCallItem]) -> list[FunctionCallOutputItem]:
    return [
        {"type": "function_call_output", "call_id": c["call_id"], "output": "ok"} for c in calls
    ]


async def test_ten_tool_calls_in_one_response(server_factory: ServerFactory) -> None:
    running = await server_factory(tool_rounds=10)
    async with (
        asyncio.timeout(30),
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
        client.connect() as stream,
    ):
        commands: list[str] = []

        def exec_command(args: dict[str, Any]) -> str:
            commands.append(args["cmd"])
            return f"ran {args['cmd']!r}"

        result = await run_agent_loop(
            stream,
            model="sim-model",
            input="fix it",
            tools=[SHELL_TOOL],
            functions={"exec_command": exec_command},
            mode="append",
        )
        final = result.final
        assert final.status == "completed" and final.output_text
        assert len(commands) == 10
        # Every pause and the end belong to one response.
        assert {turn.id for turn in result.turns} == {final.id}
        assert len(result.turns) == 11
        # Pre-inference ran once for the rollout; the engine ran once per segment.
        assert final.stats["pre_inference_runs"] == 1
        assert final.stats["engine_runs"] == 11
        assert final.stats["route_resolved"] is True
        assert [i["type"] for i in final.output].count("function_call") == 10
        stats = await client.stats()
        # Post-inference (usage accounting, store write) ran once for the whole rollout.
        assert stats["responses_total"] == 1


async def test_one_terminal_event_for_the_whole_rollout(server_factory: ServerFactory) -> None:
    running = await server_factory(tool_rounds=3)
    async with asyncio.timeout(30), open_stream(running) as stream:
        events = [
            e
            async for e in stream.create_events(
                model="sim-model", input="go", tools=[SHELL_TOOL], append_mode=True
            )
        ]
        seen = list(events)
        while seen[-1]["type"] == "response.done":
            assert seen[-1]["response"]["status"] == "in_progress"
            calls = seen[-1]["pending_calls"]
            seen = [
                e async for e in stream.append_events(seen[-1]["response"]["id"], _outputs(calls))
            ]
            events += seen
        types = [e["type"] for e in events]
        assert types.count("response.created") == 1
        assert types.count("response.done") == 3
        assert types.count("response.completed") == 1 and types[-1] == "response.completed"
        sequence = [e["sequence_number"] for e in events]
        assert sequence == list(range(len(events)))


async def test_append_with_wrong_call_id_is_rejected_and_response_keeps_waiting(
    server_factory: ServerFactory,
) -> None:
    running = await server_factory(tool_rounds=1)
    async with asyncio.timeout(30), open_stream(running) as stream:
        paused = await pause_for_tool_outputs(stream)
        assert paused.pending_calls
        with pytest.raises(ResponsesError) as caught:
            await stream.append(
                paused.id,
                [{"type": "function_call_output", "call_id": "call_wrong", "output": "x"}],
            )
        assert caught.value.code == "call_id_mismatch"
        assert caught.value.param == "input[0].call_id"
        with pytest.raises(ResponsesError) as missing:
            await stream.append(paused.id, [])
        assert missing.value.code == "call_id_mismatch"
        done = await stream.append(paused.id, _outputs(paused.pending_calls))
        assert done.status == "completed" and done.id == paused.id


async def test_append_for_a_response_that_is_not_waiting(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        finished = await stream.create(model="sim-model", input="hi")
        for target in (finished.id, "resp_unknown"):
            with pytest.raises(ResponsesError) as caught:
                await stream.append(
                    target, [{"type": "function_call_output", "call_id": "call_1", "output": "x"}]
                )
            assert caught.value.code == "response_not_waiting"
            assert caught.value.param == "response_id"
        assert (await stream.create(model="sim-model", input="still fine")).status == "completed"


async def test_response_left_waiting_ends_incomplete(
    server_factory: ServerFactory, tmp_path: Any
) -> None:
    config = make_config(tmp_path, tool_rounds=1)
    config.limits.append_timeout_s = 0.2
    running = await server_factory(config)
    async with asyncio.timeout(20), open_stream(running) as stream:
        paused = await pause_for_tool_outputs(stream)
        assert paused.pending_calls
        rest = await collect_until_terminal(stream.events())
        assert rest[-1]["type"] == "response.incomplete"
        assert rest[-1]["response"]["incomplete_details"] == {"reason": "append_timeout"}
        # Late outputs are refused, and the stream still serves new work.
        await stream.send(
            pb.ConnectRequest(
                response_append=pb.ResponseAppend(
                    response_id=paused.id,
                    input=[item_to_pb(o) for o in _outputs(paused.pending_calls)],
                )
            )
        )
        late = await collect_until_terminal(stream.events())
        assert late[-1]["error"]["code"] == "response_not_waiting"
        assert (await stream.create(model="sim-model", input="new")).status == "completed"


async def test_append_mode_needs_a_stream(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20):
        with pytest.raises(ResponsesError) as caught:
            await client.create(model="sim-model", input="go", append_mode=True)
        assert caught.value.param == "append_mode"


async def test_cancel_while_waiting_for_append(server_factory: ServerFactory) -> None:
    running = await server_factory(tool_rounds=1)
    async with asyncio.timeout(20), open_stream(running) as stream:
        paused = await pause_for_tool_outputs(stream)
        await stream.cancel(paused.id)
        rest = await collect_until_terminal(stream.events())
        assert rest[-1]["type"] == "response.incomplete"
        assert rest[-1]["response"]["status"] == "cancelled"


async def test_half_close_ends_a_response_waiting_for_outputs(
    server_factory: ServerFactory,
) -> None:
    running = await server_factory(tool_rounds=1)
    async with (
        asyncio.timeout(20),
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
    ):
        async with client.connect() as stream:
            paused = await pause_for_tool_outputs(stream)
            assert paused.pending_calls
            events = stream.events()
            await stream.close()  # half-close; the server ends the waiting response
            rest = [event async for event in events]
        assert rest[-1]["type"] == "response.incomplete"
        assert rest[-1]["response"]["incomplete_details"] == {"reason": "client_gone"}
