"""Steering over Connect with the project's client: the acknowledgement, the steered target,
the automatic successor that ``follow`` reads, and refusals that leave the stream usable."""

from __future__ import annotations

import asyncio

import pytest
from bidi_responses.client import ConnectStream, NoSuccessor, Response, SteerAck
from bidi_responses.codec import inject_to_pb, steer_to_pb
from bidi_responses.server.app import RunningServer
from bidi_responses.v1 import responses_pb2 as pb

from tests.conftest import SHELL_TOOL, ServerFactory
from tests.grpc.conftest import open_stream, pause_for_tool_outputs

pytestmark = pytest.mark.timeout(60)

# Time the target spends before its next item, so a steer sent at an event lands inside it.
STEER_MARGIN_MS = 1500


async def _steer_at(
    stream: ConnectStream, at: str, steering: object, **params: object
) -> tuple[Response, SteerAck]:
    """Create on lane ``a``, steer it at its first ``at`` event, and read it to its end."""
    ack: SteerAck | None = None
    final: Response | None = None
    target = ""
    async for event in stream.create_events(stream_id="a", model="sim-model", **params):
        if event["type"] == "response.created":
            target = event["response"]["id"]
        if event["type"] == at and ack is None:
            ack = await stream.steer(previous_response_id=target, input=steering)  # type: ignore[arg-type]
        elif event["type"] in ("response.completed", "response.incomplete"):
            final = Response.from_dict(event["response"])
    assert ack is not None and final is not None
    return final, ack


async def test_a_steer_is_accepted_the_target_stops_and_its_successor_follows(
    server_factory: ServerFactory,
) -> None:
    # The first token comes late, so the steer sent at response.created lands before it.
    running: RunningServer = await server_factory(
        tokens_per_second=200, answer_tokens=40, ttft_ms=STEER_MARGIN_MS
    )
    async with asyncio.timeout(30), open_stream(running) as stream:
        # Steered before its first item: it stops at once, with nothing cut.
        target, ack = await _steer_at(stream, "response.created", "use tabs", input="a poem")
        assert ack.accepted and ack.id and ack.previous_response_id == target.id
        assert target.steered and target.output == []
        successor = await stream.follow(target.id)
        assert successor.status == "completed"
        assert successor.previous_response_id == target.id
        assert successor.output_text
        # The lane is free again, and continues from the successor as from any response.
        after = await stream.create(
            stream_id="a", model="sim-model", input="go on", previous_response_id=successor.id
        )
        assert after.status == "completed"
        assert after.usage is not None and after.usage.cached_tokens > 0


async def test_bad_steering_input_is_refused_naming_the_field(
    server_factory: ServerFactory,
) -> None:
    running: RunningServer = await server_factory(tokens_per_second=200, answer_tokens=100)
    async with asyncio.timeout(30), open_stream(running) as stream:
        tool_output = [{"type": "function_call_output", "call_id": "c1", "output": "ok"}]
        target, ack = await _steer_at(stream, "response.created", tool_output, input="hi")
        assert not ack.accepted and ack.id is None
        assert ack.code == "invalid_input"
        assert ack.error is not None and "input[0]" in ack.error["message"]
        assert ack.input == tool_output
        # Nothing was queued: the target was not steered, and no successor follows it.
        assert target.status == "completed"
        with pytest.raises(NoSuccessor):
            await stream.follow(target.id)
        unknown = await stream.steer(previous_response_id="resp_unknown", input="x")
        assert unknown.code == "response_not_found"
        assert (await stream.create(model="sim-model", input="still here")).status == "completed"


async def test_a_target_that_ends_with_tool_calls_leaves_the_steer_pending(
    server_factory: ServerFactory,
) -> None:
    running: RunningServer = await server_factory(
        tokens_per_second=100, function_call_tokens=100, tool_rounds=1
    )
    async with asyncio.timeout(30), open_stream(running) as stream:
        # Steered inside the function call: the call finishes, and the target with it.
        target, ack = await _steer_at(
            stream,
            "response.function_call_arguments.delta",
            "use tabs",
            input="fix it",
            tools=[SHELL_TOOL],
        )
        assert ack.accepted
        assert target.status == "completed" and target.function_calls
        with pytest.raises(NoSuccessor) as pending:
            await stream.follow(target.id)
        assert pending.value.code == "waiting_for_required_input"
        call = target.function_calls[0]
        assert pending.value.required_input == [
            {"type": "function_call_output", "call_id": call["call_id"], "name": call["name"]}
        ]
        # The explicit continuation carries the outputs; the steering input goes first.
        after = await stream.create(
            stream_id="a",
            model="sim-model",
            tools=[SHELL_TOOL],
            previous_response_id=target.id,
            input=[target.call_output("ok")],
        )
        assert after.status == "completed"


async def test_a_target_that_finishes_its_last_item_completes_and_is_still_followed(
    server_factory: ServerFactory,
) -> None:
    running: RunningServer = await server_factory(tokens_per_second=200, answer_tokens=150)
    async with asyncio.timeout(30), open_stream(running) as stream:
        target, ack = await _steer_at(
            stream, "response.output_text.delta", "shorter", input="write a poem"
        )
        assert ack.accepted
        # The message being generated is never cut: it was the last item, so it completes.
        assert target.status == "completed" and target.output_text
        successor = await stream.follow(target.id)
        assert successor.status == "completed"
        assert successor.previous_response_id == target.id


async def test_inject_commits_tool_outputs_into_a_waiting_append_mode_response(
    server: RunningServer,
) -> None:
    """``response_inject`` over Connect: the outputs a response in ``response_done`` waits
    for, acknowledged, and it runs on; an inject for a response that waits for nothing is
    returned."""
    async with asyncio.timeout(30), open_stream(server) as stream:
        waiting = await pause_for_tool_outputs(stream)
        assert waiting.pending_calls
        outputs = [waiting.call_output("ok", i) for i in range(len(waiting.pending_calls))]
        await stream.send(pb.ConnectRequest(response_inject=inject_to_pb(waiting.id, outputs)))
        events = stream.events()
        seen = []
        async for event in events:
            seen.append(event)
            if event["type"] in ("response.done", "response.completed", "response.failed"):
                break
        assert seen[0] == {
            "type": "response.inject.created",
            "response_id": waiting.id,
            "sequence_number": seen[0]["sequence_number"],
        }
        assert seen[-1]["response"]["id"] == waiting.id
        await stream.send(pb.ConnectRequest(response_inject=inject_to_pb("resp_gone", outputs)))
        failed = await anext(events)
        assert failed["type"] == "response.inject.failed"
        assert failed["error"]["code"] == "response_not_found"
        assert failed["input"] == outputs


async def test_a_lane_on_a_steer_is_refused_naming_it(server_factory: ServerFactory) -> None:
    """The steer's lane is its target's: a ``stream_id`` on the envelope is refused, as over
    WebSocket, with the input returned, and the target runs on."""
    running: RunningServer = await server_factory(tokens_per_second=200, answer_tokens=40)
    async with asyncio.timeout(30), open_stream(running) as stream:
        events = stream.create_events(stream_id="a", model="sim-model", input="hi")
        created = await anext(events)
        steer = steer_to_pb(created["response"]["id"], "use tabs")
        await stream.send(pb.ConnectRequest(stream_id="a", response_steer=steer))
        seen = [event async for event in events]
        failed = next(e for e in seen if e["type"] == "response.steer.failed")
        assert failed["error"]["code"] == "invalid_input"
        assert "'stream_id'" in failed["error"]["message"]
        assert failed["steer"]["input"][0]["content"] == [
            {"type": "input_text", "text": "use tabs"}
        ]
        assert seen[-1]["type"] == "response.completed"
