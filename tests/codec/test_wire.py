"""Wire framing by hand, and decoding untrusted bytes within the nesting limit."""

from __future__ import annotations

import pytest
from bidi_responses.codec import (
    API_MAX_DEPTH,
    EVENT_FIELD,
    MessageDecodeError,
    batch_messages,
    decode_message,
    deep_messages,
    dict_to_struct,
    field_bytes,
    wire_bytes,
)
from bidi_responses.codec.wire import read_varint, varint
from bidi_responses.schema import JSONValue
from bidi_responses.v1 import responses_pb2 as pb
from hypothesis import given
from hypothesis import strategies as st


@given(st.integers(0, 2**64 - 1))
def test_varint_round_trip(value: int) -> None:
    data = varint(value)
    assert read_varint(data + b"rest", 0) == (value, len(data))


def test_a_truncated_varint_runs_off_the_end() -> None:
    with pytest.raises(IndexError):
        read_varint(b"\x80\x80", 0)


def test_field_bytes_frame_a_sub_message() -> None:
    event = pb.ConnectResponse(stream_id="a").SerializeToString()
    framed = field_bytes(EVENT_FIELD, event)
    assert pb.CreateResponseResponse.FromString(framed).event.stream_id == "a"


def test_batches_respect_the_event_count_and_the_size() -> None:
    events = [pb.ConnectResponse(stream_id=str(i)).SerializeToString() for i in range(7)]
    assert batch_messages(events[:1], 4, 1 << 20) == events[:1]
    by_count = batch_messages(events, 4, 1 << 20)
    assert [len(pb.ConnectResponse.FromString(m).batch.events) for m in by_count] == [4, 3]
    by_size = batch_messages(events, 100, 2 * len(events[0]))
    assert [len(pb.ConnectResponse.FromString(m).batch.events) for m in by_size[:3]] == [2, 2, 2]
    assert by_size[3] == events[6]  # a run of one stays a plain message


def test_wire_bytes_passes_bytes_and_serializes_messages() -> None:
    message = pb.ConnectResponse(stream_id="a")
    assert wire_bytes(b"raw") == b"raw"
    assert wire_bytes(message) == message.SerializeToString()


def _nested(levels: int) -> JSONValue:
    value: JSONValue = "leaf"
    for _ in range(levels):
        value = {"k": value}
    return value


def _tool_message(levels: int) -> bytes:
    """A request whose one tool nests ``levels`` JSON objects (built as the client builds it)."""
    with deep_messages():
        tool = pb.Tool(other=dict_to_struct({"deep": _nested(levels)}))
        params = pb.ResponseCreateParams(model="m", tools=[tool])
        return pb.CreateResponseRequest(params=params).SerializeToString()


def test_nesting_within_the_api_limit_is_decoded() -> None:
    request = decode_message(pb.CreateResponseRequest, _tool_message(60))
    assert request.params.model == "m"


def test_nesting_beyond_the_api_limit_names_the_field() -> None:
    with pytest.raises(MessageDecodeError) as caught:
        decode_message(pb.CreateResponseRequest, _tool_message(API_MAX_DEPTH // 2))
    assert caught.value.param is not None
    assert caught.value.param.startswith("params.tools.other")
    assert "nest at most" in caught.value.message


def test_invalid_utf8_names_the_field() -> None:
    data = field_bytes(1, b"\xff\xfe")  # ConnectRequest.stream_id
    with pytest.raises(MessageDecodeError) as caught:
        decode_message(pb.ConnectRequest, data)
    assert caught.value.param == "stream_id"


def test_truncated_bytes_are_refused() -> None:
    data = pb.ConnectRequest(stream_id="abc").SerializeToString()[:-1]
    with pytest.raises(MessageDecodeError, match="truncated"):
        decode_message(pb.ConnectRequest, data)
