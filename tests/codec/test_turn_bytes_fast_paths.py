"""The turn writer's fast paths write exactly the message path's bytes for odd values too, and
what they remember (an item's head, a response's fixed fields, its stats, its items) is used
only while it is the same."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
from bidi_responses.codec import JSONObject, ProtoEncoder, unbatch
from bidi_responses.codec.wire import batch_messages, varint
from bidi_responses.v1 import responses_pb2 as pb
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.codec.headline_turn import headline_turn, response

_text = st.text(max_size=40)  # any code point but lone surrogates, which no JSON carries
_seq = st.integers(0, 2**63 - 1)
_index = st.integers(0, 2**31 - 1)
# Values at each varint length and its edges, as the hand-written varints take separate paths.
EDGES = [0, 1, 127, 128, 16_383, 16_384, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**35 - 1, 2**35]


def _one_entry_maps(r: JSONObject) -> JSONObject:
    """``r`` with the stats' maps cut to one entry: upb writes a map's entries in an order
    of its own, so only one entry compares byte for byte."""
    stats = r.get("stats")
    if not stats:
        return r
    cut = {k: dict(list(v.items())[:1]) if isinstance(v, dict) else v for k, v in stats.items()}
    return {**r, "stats": cut}


def _same_bytes(events: list[JSONObject], lane: str = "a", **options: bool) -> None:
    """Each event, written in order by one encoder, is the message path's bytes."""
    encoder, reference = ProtoEncoder(**options), ProtoEncoder(**options)
    for event in events:
        assert encoder.event_bytes(lane, event) == reference.message_bytes(lane, event), event


@given(value=st.one_of(st.sampled_from(EDGES), st.integers(-(2**63), 2**63 - 1)))
def test_a_varint_is_what_upb_writes(value: int) -> None:
    # An int64 field: upb leaves out zero, and writes a negative value in ten bytes.
    expected = pb.Usage(input_tokens=value).SerializeToString()[1:] if value else b"\x00"
    assert varint(value) == expected


@pytest.mark.parametrize("seq", EDGES)
@pytest.mark.parametrize("text", ["", "a", "é", "数据", "🙂" * 40, "x" * 200, "x" * 20_000])
def test_deltas_and_dones_of_odd_content_and_numbers(text: str, seq: int) -> None:
    turn = headline_turn()
    events = [
        {**e, "sequence_number": seq}
        | ({"delta": text} if "delta" in e else {})
        | ({"text": text} if e["type"] == "response.output_text.done" else {})
        | ({"arguments": text} if e["type"] == "response.function_call_arguments.done" else {})
        for e in turn[2:-1]
    ]
    _same_bytes(events)


@pytest.mark.parametrize("index", [0, 1, 127, 128, 16_384, 2**31 - 1])
@pytest.mark.parametrize("item_id", ["", "msg_1", "ü" * 100])
def test_an_items_head_of_any_id_and_index(index: int, item_id: str) -> None:
    events: list[JSONObject] = []
    for e in headline_turn()[2:-1]:
        changed = dict(e)
        if "item_id" in changed:
            changed["item_id"] = item_id
        for name in ("output_index", "content_index"):
            if name in changed:
                changed[name] = index
        events.append(changed)
    _same_bytes(events)


def test_heads_follow_the_item_when_items_interleave() -> None:
    """Deltas of two texts and two calls in turn (parallel output), dones and parts between:
    each event gets its own item's head."""
    turn = headline_turn()
    text, args = turn[4], turn[15]
    events = []
    for n in range(4):
        events.append({**text, "item_id": f"msg_{n % 2}", "content_index": n % 2})
        events.append({**args, "item_id": f"fc_{n % 2}", "output_index": 1 + n % 2})
        events.append({**turn[11], "item_id": f"msg_{n % 2}"})  # the text's done event
        events.append({**turn[21], "item_id": f"fc_{n % 2}"})  # the arguments' done event
        events.append({**turn[12], "item_id": f"msg_{(n + 1) % 2}"})  # a part
    _same_bytes(events)
    _same_bytes(events, lane="")


_status = st.sampled_from(
    ["queued", "in_progress", "completed", "failed", "incomplete", "cancelled", "", "odd ✓"]
)
_optional_int = st.one_of(st.none(), st.sampled_from(EDGES[1:]))


@settings(max_examples=60)
@given(
    id_=_text,
    created_at=st.sampled_from(EDGES),
    completed_at=_optional_int,
    status=_status,
    previous=st.one_of(st.none(), _text),
    reason=st.one_of(st.none(), _text),
    error=st.one_of(st.none(), st.fixed_dictionaries({"code": _text, "message": _text})),
    counts=st.lists(st.sampled_from(EDGES), min_size=5, max_size=5),
    with_stats=st.booleans(),
    slim=st.booleans(),
    json_parameters=st.booleans(),
    seq=_seq,
)
def test_snapshots_of_any_progress(
    id_: str,
    created_at: int,
    completed_at: int | None,
    status: str,
    previous: str | None,
    reason: str | None,
    error: JSONObject | None,
    counts: list[int],
    with_stats: bool,
    slim: bool,
    json_parameters: bool,
    seq: int,
) -> None:
    final = headline_turn()[-1]["response"]
    inputs, cached, outputs, reasoning, total = counts
    r: JSONObject = {
        **_one_entry_maps(final),
        "id": id_,
        "created_at": created_at,
        "completed_at": completed_at,
        "status": status,
        "previous_response_id": previous,
        "incomplete_details": None if reason is None else {"reason": reason},
        "error": error,
        "usage": {
            "input_tokens": inputs,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": outputs,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": total,
        },
    }
    if not with_stats:
        del r["stats"]
    kinds = ("response.created", "response.in_progress", "response.completed")
    events = [{"type": kind, "response": r, "sequence_number": seq} for kind in kinds]
    _same_bytes(events, slim=slim, json_parameters=json_parameters)


def test_snapshots_without_optional_fields() -> None:
    """A response as small as the message path takes: no usage, stats, flags, previous
    response, completion time or output; and one whose usage counts are all zero."""
    r = _one_entry_maps(response("in_progress", []))
    bare = {
        k: v
        for k, v in r.items()
        if k not in ("usage", "stats", "safety_flags", "previous_response_id", "completed_at")
    }
    zeros = {
        **r,
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }
    for value in (bare, zeros, {**r, "safety_flags": [{"classifier": "c", "code": "x"}]}):
        for slim in (False, True):
            _same_bytes(
                [{"type": "response.created", "response": value, "sequence_number": 0}],
                slim=slim,
            )


def _snapshot(encoder: ProtoEncoder, r: JSONObject) -> pb.Response:
    data = encoder.event_bytes("", {"type": "response.in_progress", "response": r})
    return pb.ConnectResponse.FromString(data).response_in_progress.response


def test_stats_changed_in_place_are_written_anew() -> None:
    encoder = ProtoEncoder()
    r = response("in_progress", [])
    stats: dict[str, Any] = r["stats"]
    assert _snapshot(encoder, r).stats.tokens_rendered == 2028
    stats["tokens_rendered"] = 5
    stats["stage_ms"]["validation"] = 9.5
    read = _snapshot(encoder, r).stats
    assert read.tokens_rendered == 5 and read.stage_ms["validation"] == 9.5


def test_a_responses_fixed_fields_follow_each_response() -> None:
    """id, created_at and previous_response_id are written once per response: another value
    of any one of them is written anew, in any order of responses."""
    encoder = ProtoEncoder()
    r = response("in_progress", [])
    variants = [
        r,
        {**r, "previous_response_id": "resp_another"},
        {**r, "id": "resp_other"},
        {**r, "created_at": 1},
        {**r, "previous_response_id": None},
        {**r, "previous_response_id": ""},
        r,
    ]
    for value in variants:
        read = _snapshot(encoder, value)
        assert (read.id, read.created_at) == (value["id"], value["created_at"])
        previous = value["previous_response_id"]
        assert read.HasField("previous_response_id") == (previous is not None)
        assert read.previous_response_id == (previous or "")


def test_an_odd_stats_value_takes_the_message_path() -> None:
    """A value upb refuses in the stats (a bool for a count) fails as the message path fails,
    even after the same counts were written."""
    encoder = ProtoEncoder()
    r = response("in_progress", [])
    encoder.event_bytes("", {"type": "response.created", "response": r})
    bad = {**r, "stats": {**r["stats"], "items_validated": True}}
    event = {"type": "response.in_progress", "response": bad}
    with pytest.raises(TypeError):
        ProtoEncoder().message_bytes("", event)
    with pytest.raises(TypeError):
        encoder.event_bytes("", event)


def test_a_turn_of_slim_snapshots_and_json_schemas_is_the_message_paths() -> None:
    turn = [
        {**e, "response": _one_entry_maps(e["response"])} if "response" in e else e
        for e in headline_turn()
    ]
    for slim, json_parameters in ((True, False), (False, True)):
        _same_bytes(turn + turn, slim=slim, json_parameters=json_parameters)


def test_a_batch_of_a_turns_events_reads_back_as_each_event() -> None:
    turn = headline_turn()
    encoder = ProtoEncoder()
    written = [encoder.event_bytes("lane", e) for e in turn]
    read = [
        event
        for message in batch_messages(written, 8, 1 << 20)
        for event in unbatch(pb.ConnectResponse.FromString(message))
    ]
    assert list(read) == [pb.ConnectResponse.FromString(data) for data in written]


def test_an_encoder_is_freed_with_its_stream() -> None:
    """No reference cycle keeps an encoder (and the echoes it holds) alive until a full
    collection: it goes when its stream lets go of it."""
    encoder = ProtoEncoder()
    for event in headline_turn():
        encoder.event_bytes("lane", event)
    gone = weakref.ref(encoder)
    gc.disable()
    try:
        del encoder
        assert gone() is None
    finally:
        gc.enable()
