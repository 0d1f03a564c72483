"""Event delivery options: batched messages and slim snapshots, opt-in per stream or call.

Stock generated stubs are used directly (no project client) where the wire itself is checked:
what an old client that never sets ``delivery`` receives, and what a batch looks like.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.codec import EventDecoder, ProtoEncoder, params_to_pb, unbatch
from bidi_responses.server.app import RunningServer
from bidi_responses.server.config import StreamingConfig
from bidi_responses.server.core.runs.record import OutEvent
from bidi_responses.server.transports.grpc.delivery import (
    MAX_DELTA_WINDOW_MS,
    Delivery,
    Outbound,
)
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from tests.conftest import SHELL_TOOL, ServerFactory, make_config

_TERMINAL = {"response_completed", "response_failed", "response_incomplete", "error"}
_BODY: dict[str, Any] = {
    "model": "sim-model",
    "instructions": "You are a careful agent.",
    "input": "fix the test",
    "tools": [SHELL_TOOL],
}


async def _one_turn(
    stub: pb_grpc.ResponsesServiceAsyncStub,
    delivery: pb.DeliveryOptions | None,
    body: dict[str, Any] = _BODY,
) -> list[pb.ConnectResponse]:
    """Raw messages of one Connect turn, from a stock stub."""
    request = pb.ConnectRequest(response_create=params_to_pb(body))
    if delivery is not None:
        request.delivery.CopyFrom(delivery)
    queue: asyncio.Queue[pb.ConnectRequest | None] = asyncio.Queue()
    queue.put_nowait(request)

    async def requests() -> AsyncIterator[pb.ConnectRequest]:
        while (item := await queue.get()) is not None:
            yield item

    call = stub.Connect(requests())
    messages: list[pb.ConnectResponse] = []
    async for message in call:
        messages.append(message)
        if any(e.WhichOneof("event") in _TERMINAL for e in unbatch(message)):
            queue.put_nowait(None)
    return messages


def _payload(event: pb.ConnectResponse) -> Any:
    """The message inside the event's oneof (each has a sequence number; snapshots a response)."""
    which = event.WhichOneof("event")
    assert which is not None
    return getattr(event, which)


def _flat(messages: list[pb.ConnectResponse]) -> list[pb.ConnectResponse]:
    return [event for message in messages for event in unbatch(message)]


@pytest.fixture
async def stub(server: RunningServer) -> AsyncIterator[pb_grpc.ResponsesServiceAsyncStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield pb_grpc.ResponsesServiceStub(channel)


async def test_a_client_that_sets_no_options_gets_one_event_per_message(
    stub: pb_grpc.ResponsesServiceAsyncStub,
) -> None:
    async with asyncio.timeout(20):
        messages = await _one_turn(stub, None)
    kinds = [m.WhichOneof("event") for m in messages]
    assert "batch" not in kinds
    assert kinds[0] == "response_created" and kinds[-1] == "response_completed"
    created = messages[0].response_created.response
    assert not created.slim and created.instructions and len(created.tools) == 1


async def test_batches_carry_ready_events_in_order(
    stub: pb_grpc.ResponsesServiceAsyncStub,
) -> None:
    async with asyncio.timeout(20):
        single = _flat(await _one_turn(stub, None))
        messages = await _one_turn(stub, pb.DeliveryOptions(batch_events=True))
    events = _flat(messages)
    batches = [m for m in messages if m.WhichOneof("event") == "batch"]
    # created and in_progress are emitted in the same step, so they always travel together.
    assert batches and [e.WhichOneof("event") for e in batches[0].batch.events][:2] == [
        "response_created",
        "response_in_progress",
    ]
    assert all(len(m.batch.events) > 1 for m in batches)  # a lone event is a plain message
    assert len(messages) < len(events)
    decoder = EventDecoder()
    decoded = [decoder.event(e) for e in events]
    # Strictly increasing; a gap only where waiting deltas were merged (outbound.py).
    numbers = [e["sequence_number"] for e in decoded]
    assert numbers[0] == 0 and all(a < b for a, b in itertools.pairwise(numbers))
    # The end of the segment is one step: the last item's done events travel with the
    # terminal event, even though post-inference runs between them.
    last = [e.WhichOneof("event") for e in unbatch(messages[-1])]
    assert last[-2:] == ["response_output_item_done", "response_completed"]
    # The same engine output as without batching (the sim is seeded): same calls.
    assert _same_calls(decoded[-1], EventDecoder().event(single[-1]))


def _same_calls(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def shape(event: dict[str, Any]) -> list[tuple[str, str]]:
        return [(i["name"], i["arguments"]) for i in event["response"]["output"]]

    return shape(a) == shape(b)


async def test_max_batch_events_bounds_each_message(
    stub: pb_grpc.ResponsesServiceAsyncStub,
) -> None:
    async with asyncio.timeout(20):
        messages = await _one_turn(stub, pb.DeliveryOptions(batch_events=True, max_batch_events=2))
    assert max(len(unbatch(m)) for m in messages) == 2


async def test_server_byte_bound_splits_batches(
    server_factory: ServerFactory, tmp_path: Any
) -> None:
    config = make_config(tmp_path)
    config.streaming.max_batch_bytes = 1  # every event exceeds it: each travels alone
    running = await server_factory(config)
    async with (
        asyncio.timeout(20),
        grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        stub = pb_grpc.ResponsesServiceStub(channel)
        messages = await _one_turn(stub, pb.DeliveryOptions(batch_events=True))
    assert all(m.WhichOneof("event") != "batch" for m in messages)


async def test_slim_snapshots_leave_out_instructions_and_tools_only(
    stub: pb_grpc.ResponsesServiceAsyncStub,
) -> None:
    options = pb.DeliveryOptions(batch_events=True, snapshot_detail=pb.SNAPSHOT_DETAIL_SLIM)
    async with asyncio.timeout(20):
        slim = _flat(await _one_turn(stub, options))
        full = _flat(await _one_turn(stub, None))
    snapshots = [
        _payload(e).response
        for e in slim
        if e.WhichOneof("event")
        in ("response_created", "response_in_progress", "response_completed")
    ]
    assert len(snapshots) == 3
    for response in snapshots:
        assert response.slim and not response.tools and not response.HasField("instructions")
        assert response.model == "sim-model" and response.id
    done = slim[-1].response_completed.response
    assert done.status == "completed" and done.output and done.usage.output_tokens > 0
    assert done.HasField("stats")
    full_done = full[-1].response_completed.response
    assert not full_done.slim and full_done.instructions == _BODY["instructions"]
    assert done.ByteSize() < full_done.ByteSize()


async def test_a_bad_snapshot_detail_is_an_error_naming_the_field(
    stub: pb_grpc.ResponsesServiceAsyncStub,
) -> None:
    async with asyncio.timeout(20):
        messages = await _one_turn(stub, pb.DeliveryOptions(snapshot_detail=7))  # type: ignore[arg-type]
        assert messages[-1].error.error.param == "delivery.snapshot_detail"
        call = stub.CreateResponse(
            pb.CreateResponseRequest(
                params=params_to_pb(_BODY),
                delivery=pb.DeliveryOptions(snapshot_detail=7),  # type: ignore[arg-type]
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in call:
                pass
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "delivery.snapshot_detail" in (raised.value.details() or "")


async def test_create_response_batches_too(stub: pb_grpc.ResponsesServiceAsyncStub) -> None:
    async with asyncio.timeout(20):
        call = stub.CreateResponse(
            pb.CreateResponseRequest(
                params=params_to_pb(_BODY), delivery=pb.DeliveryOptions(batch_events=True)
            )
        )
        messages = [m.event async for m in call]
    events = _flat(messages)
    assert any(m.WhichOneof("event") == "batch" for m in messages)
    assert events[0].WhichOneof("event") == "response_created"
    assert events[-1].WhichOneof("event") == "response_completed"
    numbers = [_payload(e).sequence_number for e in events]
    assert numbers == list(range(len(events)))


@pytest.mark.parametrize("batch", [True, False])
async def test_the_python_client_yields_one_event_at_a_time(
    server: RunningServer, batch: bool
) -> None:
    async with (
        asyncio.timeout(20),
        AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}", batch_events=batch) as client,
        client.connect() as stream,
    ):
        events = [e async for e in stream.create_events(**_BODY)]
        again = await stream.create(
            model="sim-model", input="go on", previous_response_id=events[-1]["response"]["id"]
        )
        stateless = [e async for e in client.create_events(**_BODY)]
    for seen in (events, stateless):
        assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
        assert seen[0]["type"] == "response.created"
        assert seen[-1]["type"] == "response.completed"
    assert again.status == "completed"


async def test_the_python_client_can_ask_for_slim_snapshots(server: RunningServer) -> None:
    async with (
        asyncio.timeout(20),
        AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}", snapshots="slim") as client,
        client.connect() as stream,
    ):
        response = await stream.create(**_BODY)
    assert response.raw["tools"] == [] and response.raw["instructions"] is None
    assert response.output and response.usage is not None
    with pytest.raises(ValueError, match="snapshots"):
        AsyncResponsesClient("127.0.0.1:1", snapshots="tiny")


@pytest.mark.parametrize("slim", [False, True])
async def test_hand_built_snapshot_bytes_equal_the_message(
    server: RunningServer, slim: bool
) -> None:
    async with (
        asyncio.timeout(20),
        AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client,
        client.connect() as stream,
    ):
        events = [e async for e in stream.create_events(**_BODY, metadata={"k": "v"})]
    encoder = ProtoEncoder(slim=slim)
    for event in events:
        for lane in ("", "lane-1"):
            built = pb.ConnectResponse.FromString(encoder.event_bytes(lane, event))
            assert built == encoder.connect_response(lane, event), event["type"]


def test_an_event_the_encoder_cannot_map_becomes_an_error_event_on_its_lane() -> None:
    """A server fault in encoding must not end the call INTERNAL: the lane gets a 500."""
    bad: Any = {"type": "response.not_in_the_proto"}
    ok: Any = {"type": "warning", "code": "c", "message": "m"}
    messages = Outbound().messages([OutEvent("a", bad), OutEvent("", ok)])
    first, second = (EventDecoder.event(pb.ConnectResponse.FromString(m)) for m in messages)
    assert first["type"] == "error" and first["stream_id"] == "a"
    assert first["status"] == 500 and first["error"]["code"] == "server_error"
    assert second == ok


async def test_a_client_chosen_delta_window_sends_fewer_coarser_deltas(
    server_factory: ServerFactory, tmp_path: Any
) -> None:
    # 400 tokens at 1,000 tokens/s: the default 2 ms window sends about one delta per two
    # tokens; a 100 ms window at most one per 100 ms of generation (and never delays the first).
    config = make_config(tmp_path, tokens_per_second=1000, answer_tokens=400, tool_rounds=0)
    running = await server_factory(config)
    body = {"model": "sim-model", "input": "explain the fix"}
    async with (
        asyncio.timeout(30),
        grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        stub = pb_grpc.ResponsesServiceStub(channel)
        coarse = _flat(await _one_turn(stub, pb.DeliveryOptions(delta_window_ms=100), body))
    decoder = EventDecoder()
    events = [decoder.event(e) for e in coarse]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert "".join(deltas) == done["text"] and len(done["text"]) > 400
    assert 1 < len(deltas) <= 40  # 400 tokens at the default window: about 200 deltas


def test_delta_window_is_bounded_by_the_server() -> None:
    streaming = StreamingConfig()
    delivery = Delivery.from_pb(pb.DeliveryOptions(delta_window_ms=10_000), streaming)
    assert delivery.delta_window_ms == MAX_DELTA_WINDOW_MS
    assert delivery.streaming(streaming).delta_window_ms == MAX_DELTA_WINDOW_MS
    assert Delivery.from_pb(pb.DeliveryOptions(), streaming).streaming(streaming) is streaming


async def test_the_project_client_asks_for_a_20_ms_window_unless_told_otherwise(
    server_factory: ServerFactory, tmp_path: Any
) -> None:
    # 120 tokens at 250 tokens/s take 480 ms, one every 4 ms: a 20 ms window sends about 25
    # deltas; the server's 2 ms window (delta_window_ms=0) closes before the next token is due,
    # so it sends about one a token. A loaded machine only merges more, so the default's bound
    # is firm; the fine count is compared with the default's, measured in the same run.
    config = make_config(tmp_path, tokens_per_second=250, answer_tokens=120, tool_rounds=0)
    running = await server_factory(config)
    target = f"127.0.0.1:{running.grpc_port}"
    body: dict[str, Any] = {"model": "sim-model", "input": "explain the fix"}

    async def deltas_of(client: AsyncResponsesClient) -> tuple[list[str], str]:
        async with client, client.connect() as stream:
            events = [e async for e in stream.create_events(**body)]
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        done = next(e for e in events if e["type"] == "response.output_text.done")
        return deltas, done["text"]

    async with asyncio.timeout(30):
        default, text = await deltas_of(AsyncResponsesClient(target))
        fine, fine_text = await deltas_of(AsyncResponsesClient(target, delta_window_ms=0))
    assert "".join(default) == text and "".join(fine) == fine_text and len(text) > 100
    assert 1 < len(default) <= 30
    assert len(fine) >= 2 * len(default)
