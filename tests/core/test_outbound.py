"""The outbound queue (``Outbox``): deltas merged while the writer falls behind, and a held
step taken whole by a batching writer."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from bidi_responses.schema import ServerEvent
from bidi_responses.server.core.lanes import StreamNaming
from bidi_responses.server.core.lanes.outbound import Outbox
from bidi_responses.server.core.runs.record import OutEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from tests.core.fake_engine import ScriptedCore, ScriptedEngine, Turn

pytestmark = pytest.mark.timeout(60)

Event = dict[str, Any]
DELTA = "response.output_text.delta"
ARGS = "response.function_call_arguments.delta"


def _out(lane: str, **data: Any) -> OutEvent:
    return OutEvent(lane, cast(ServerEvent, data))


def _delta(lane: str, item: str, text: str, seq: int, part: int = 0) -> OutEvent:
    return _out(
        lane,
        type=DELTA,
        item_id=item,
        output_index=0,
        content_index=part,
        delta=text,
        sequence_number=seq,
    )


def _key(out: OutEvent) -> tuple[str, str, int]:
    data = cast(Event, out.data)
    return out.lane, data["item_id"], data.get("content_index", -1)


def _texts(events: list[OutEvent]) -> dict[tuple[str, str, int], str]:
    """Each item part's concatenated delta text."""
    texts: dict[tuple[str, str, int], str] = {}
    for out in events:
        data = cast(Event, out.data)
        if data["type"] in (DELTA, ARGS):
            texts[_key(out)] = texts.get(_key(out), "") + data["delta"]
    return texts


def _others(events: list[OutEvent]) -> list[tuple[str, int]]:
    return [
        (out.lane, cast(Event, out.data)["sequence_number"])
        for out in events
        if cast(Event, out.data)["type"] not in (DELTA, ARGS)
    ]


# One step of a random stream: a delta (lane, item, part, text), another event, or a stall
# (the writer takes what is waiting).
_step = st.one_of(
    st.tuples(
        st.just("delta"),
        st.sampled_from(["", "b"]),
        st.sampled_from(["msg_1", "fc_2"]),
        st.integers(0, 1),
        st.text(min_size=0, max_size=4),
    ),
    st.tuples(st.just("other"), st.sampled_from(["", "b"])),
    st.tuples(st.just("take"), st.integers(1, 5)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, max_size=60), st.integers(1, 12))
def test_merging_keeps_every_delta_and_the_order(steps: list[Any], max_chars: int) -> None:
    outbox = Outbox(max_merged_chars=max_chars)
    sent: list[OutEvent] = []
    written: list[OutEvent] = []
    seq = 0
    for step in steps:
        if step[0] == "take":
            for _ in range(step[1]):
                if not outbox.empty():
                    item = outbox.get_nowait()
                    assert item is not None
                    written.append(item)
            continue
        seq += 1
        lane = step[1]
        if step[0] == "delta":
            _, _, item_id, part, text = step
            if item_id == "fc_2":
                out = _out(
                    lane, type=ARGS, item_id=item_id, output_index=1, delta=text,
                    sequence_number=seq,
                )  # fmt: skip
            else:
                out = _delta(lane, item_id, text, seq, part)
        else:
            out = _out(lane, type="response.in_progress", sequence_number=seq)
        sent.append(out)
        outbox.put_nowait(out)
    while not outbox.empty():
        item = outbox.get_nowait()
        assert item is not None
        written.append(item)
    # Nothing lost, nothing reordered: per item part the same text, every other event in place.
    assert _texts(written) == _texts(sent)
    assert _others(written) == _others(sent)
    numbers = [cast(Event, out.data)["sequence_number"] for out in written]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert len(written) == len(sent) - outbox.merged
    # A merged delta carries the last merged delta's number, and the events sent between two
    # written deltas of a part are exactly those of that part (adjacent, nothing between).
    by_number = {cast(Event, out.data)["sequence_number"]: out for out in sent}
    previous = 0
    for out in written:
        number = cast(Event, out.data)["sequence_number"]
        covered = [by_number[n] for n in range(previous + 1, number + 1)]
        if len(covered) > 1:
            assert all(_key(c) == _key(out) and c.data["type"] == out.data["type"] for c in covered)
            assert len(cast(Event, out.data)["delta"]) <= max_chars
            assert (
                "".join(cast(Event, c.data)["delta"] for c in covered)
                == cast(Event, out.data)["delta"]
            )
        previous = number


async def test_nothing_merges_once_the_writer_took_the_tail() -> None:
    outbox = Outbox()
    outbox.put_nowait(_delta("", "msg_1", "a", 1))
    taken = await outbox.take(64)
    outbox.put_nowait(_delta("", "msg_1", "b", 2))
    outbox.put_nowait(_delta("", "msg_1", "c", 3))
    rest = await outbox.take(64)
    assert [cast(Event, o.data)["delta"] for o in taken if o] == ["a"]
    assert [
        (cast(Event, o.data)["delta"], cast(Event, o.data)["sequence_number"]) for o in rest if o
    ] == [("bc", 3)]
    assert outbox.merged == 1


async def test_a_held_step_is_taken_whole_with_its_terminal_event() -> None:
    outbox = Outbox()
    outbox.hold("")
    outbox.put_nowait(_out("", type="response.output_item.done", sequence_number=5))
    taking = asyncio.ensure_future(outbox.take(64))
    for _ in range(5):  # the writer gets every chance to run; it must keep waiting
        await asyncio.sleep(0)
    assert not taking.done()
    outbox.put_nowait(_out("", type="response.completed", sequence_number=6))
    async with asyncio.timeout(5):
        batch = await taking
    assert [cast(Event, o.data)["type"] for o in batch if o] == [
        "response.output_item.done",
        "response.completed",
    ]
    # The hold ended with the terminal event: the next take does not wait.
    outbox.put_nowait(_out("", type="response.created", sequence_number=0))
    async with asyncio.timeout(5):
        assert len(await outbox.take(64)) == 1


async def test_a_hold_never_delays_another_lane_or_outlives_its_run() -> None:
    outbox = Outbox()
    outbox.hold("a")
    outbox.put_nowait(_out("b", type="response.created", sequence_number=0))
    outbox.put_nowait(_out("a", type="response.output_item.done", sequence_number=3))
    outbox.put_nowait(_out("b", type="response.in_progress", sequence_number=1))
    async with asyncio.timeout(5):
        first = await outbox.take(64)  # lane b's event goes at once, without a's held step
    assert [(o.lane, cast(Event, o.data)["sequence_number"]) for o in first if o] == [("b", 0)]
    taking = asyncio.ensure_future(outbox.take(64))
    await asyncio.sleep(0)
    assert not taking.done()  # a's step is not over
    outbox.release("a")  # its run ended without a terminal event
    async with asyncio.timeout(5):
        rest = await taking
    assert [(o.lane, cast(Event, o.data)["sequence_number"]) for o in rest if o] == [
        ("a", 3),
        ("b", 1),
    ]


async def test_an_unread_session_sends_one_merged_delta_per_item(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    core.config.streaming.max_delta_chars = 1  # the engine stream merges nothing: one event each
    engine.turns.append(Turn(deltas=("Hel", "lo", " wor", "ld")))
    session = core.open_session(StreamNaming("test"))
    try:
        async with asyncio.timeout(20):
            await session.handle({"type": "response.create", "model": "sim-model", "input": "hi"})
            await session.finish()  # the response runs to its end while nobody reads
            events: list[Event] = []
            async for batch in session.event_batches(64):
                events.extend(cast(Event, out.data) for out in batch)
    finally:
        await core.close_session(session)
    deltas = [e for e in events if e["type"] == DELTA]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert [d["delta"] for d in deltas] == ["Hello world"]
    assert done["text"] == "Hello world"
    numbers = [e["sequence_number"] for e in events]
    assert numbers == sorted(numbers) and numbers[-1] == len(events) - 1 + 3  # 3 merged away
    # The openai SDK's stream accumulator takes the merged delta and its numbering as is.
    state: ResponseStreamState[None] = ResponseStreamState(input_tools=omit, text_format=omit)
    snapshots = [
        handled.snapshot
        for event in events
        for handled in state.handle_event(
            cast(Any, construct_type(type_=ResponseStreamEvent, value=event))
        )
        if handled.type == "response.output_text.delta"
    ]
    assert snapshots == ["Hello world"]
