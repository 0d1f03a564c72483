"""Steering and injection on the wire: what a client encodes, the server decodes as WebSocket
mode's exact client events, and the acknowledgements the server encodes read back unchanged."""

from __future__ import annotations

from bidi_responses.codec import (
    EventDecoder,
    JSONObject,
    ProtoDecoder,
    ProtoEncoder,
    inject_to_pb,
    input_items_to_pb,
    item_to_dict,
    steer_to_pb,
)
from bidi_responses.codec.wire import VARINT, field_bytes, tag, varint
from bidi_responses.v1 import responses_pb2 as pb

from tests.codec.test_events import RESPONSE

USER_TEXT: JSONObject = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "use tabs"}],
}
OUTPUT: JSONObject = {"type": "function_call_output", "call_id": "c1", "output": "ok"}


def test_a_steer_decodes_to_exactly_websocket_modes_three_fields() -> None:
    request = pb.ConnectRequest(event_id="e1", response_steer=steer_to_pb("resp_1", "use tabs"))
    # A string is one user message; the event id has nothing to answer (the acknowledgement
    # names the target), so the core sees only what a WebSocket client may send.
    assert ProtoDecoder.client_event(request) == {
        "type": "response.steer",
        "previous_response_id": "resp_1",
        "input": [USER_TEXT],
    }


def test_a_steer_keeps_its_items_in_order() -> None:
    second = {**USER_TEXT, "content": [{"type": "input_text", "text": "and spaces"}]}
    request = pb.ConnectRequest(response_steer=steer_to_pb("resp_1", [USER_TEXT, second]))
    assert ProtoDecoder.client_event(request)["input"] == [USER_TEXT, second]


def test_a_lane_on_a_steer_reaches_the_core_to_be_refused() -> None:
    """WebSocket mode refuses ``stream_id`` on a steer; Connect must not hide it."""
    request = pb.ConnectRequest(stream_id="a", response_steer=steer_to_pb("resp_1", "x"))
    assert ProtoDecoder.client_event(request)["stream_id"] == "a"


def test_an_inject_decodes_to_websocket_modes_event() -> None:
    request = pb.ConnectRequest(event_id="e1", response_inject=inject_to_pb("resp_1", [OUTPUT]))
    assert ProtoDecoder.client_event(request) == {
        "type": "response.inject",
        "response_id": "resp_1",
        "input": [OUTPUT],
    }


def test_returned_input_loses_nothing() -> None:
    """A failed steer returns what was sent, even when it was not a well-formed item."""
    odd: list[object] = [
        {"type": "message", "role": "system", "content": "be terse"},
        {"type": "message", "content": [{"type": "input_text", "text": "no role"}]},
        "a bare string",
    ]
    items = [item_to_dict(i) for i in input_items_to_pb(odd)]
    assert items[0] == {
        "type": "message",
        "role": "system",
        "content": [{"type": "input_text", "text": "be terse"}],
    }
    assert items[1] == odd[1]  # no role: carried whole as Item.other
    assert items[2] == {"value": "a bare string"}
    assert input_items_to_pb(None) == []


def test_a_failed_steer_with_string_input_comes_back_as_one_user_message() -> None:
    """Over WebSocket a steer's input may be a string; Connect returns it as an item."""
    event: JSONObject = {
        "type": "response.steer.failed",
        "steer": {"previous_response_id": "resp_1", "input": "use tabs"},
        "error": {"code": "response_not_found", "message": "m", "type": "invalid_request_error"},
        "sequence_number": 4,
    }
    read = EventDecoder.event(ProtoEncoder().connect_response("", event))
    assert read["steer"] == {"previous_response_id": "resp_1", "input": [USER_TEXT]}
    assert "id" not in read["steer"]


def test_an_accepted_steer_is_the_bytes_the_proto_defines() -> None:
    """Field numbers are the contract with clients generated from the proto: pin them."""
    event: JSONObject = {
        "type": "response.steer.accepted",
        "steer": {"id": "steer_1", "previous_response_id": "resp_1"},
        "sequence_number": 3,
    }
    data = ProtoEncoder().event_bytes("a", event)
    ref = field_bytes(1, b"steer_1") + field_bytes(2, b"resp_1")
    accepted = field_bytes(1, ref) + tag(2, VARINT) + varint(3)
    assert data == field_bytes(1, b"a") + field_bytes(19, accepted)


def test_a_queued_snapshot_has_its_own_case() -> None:
    response: JSONObject = {**RESPONSE, "status": "queued"}
    data = ProtoEncoder().event_bytes("", {"type": "response.queued", "response": response})
    message = pb.ConnectResponse.FromString(data)
    assert message.WhichOneof("event") == "response_queued"
    assert message.response_queued.response.status == "queued"
