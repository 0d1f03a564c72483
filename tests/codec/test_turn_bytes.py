"""The hand-written event bytes are the bytes the message path writes, and what the encoder
and decoder reuse between events and turns is reused only while it is the same."""

from __future__ import annotations

from typing import Any

import pytest
from bidi_responses.codec import (
    EventDecoder,
    JSONObject,
    ProtoDecoder,
    ProtoEncoder,
    event_encoder,
    params_to_pb,
    tools,
)
from bidi_responses.codec.responses import response_echo_to_pb
from bidi_responses.codec.tools import tool_to_pb, tools_to_dicts
from bidi_responses.server.core.api.tools import ToolList
from bidi_responses.v1 import responses_pb2 as pb
from hypothesis import given
from hypothesis import strategies as st

from tests.codec.headline_turn import create_body, headline_turn, response
from tests.codec.test_events import EVENTS


def _one_entry_maps(events: list[JSONObject]) -> list[JSONObject]:
    """The events with the stats' maps cut to one entry: upb writes a map's entries in an
    order of its own (which differs between processes), so only one entry compares byte
    for byte."""
    out = []
    for event in events:
        if "response" in event:
            stats = event["response"]["stats"]
            stats = {
                k: dict(list(v.items())[:1]) if isinstance(v, dict) else v for k, v in stats.items()
            }
            event = {**event, "response": {**event["response"], "stats": stats}}
        out.append(event)
    return out


FULL_TURN = headline_turn()
TURN = _one_entry_maps(FULL_TURN)


def test_a_turn_with_whole_maps_reads_back_as_the_message_path_writes_it() -> None:
    encoder, reference = ProtoEncoder(), ProtoEncoder()
    for event in FULL_TURN:
        data, expected = encoder.event_bytes("a", event), reference.message_bytes("a", event)
        assert len(data) == len(expected)
        assert pb.ConnectResponse.FromString(data) == pb.ConnectResponse.FromString(expected)


@pytest.mark.parametrize("lane", ["", "lane-a"])
@pytest.mark.parametrize("slim", [False, True])
def test_a_turn_is_written_byte_for_byte_as_the_message_path_writes_it(
    lane: str, slim: bool
) -> None:
    encoder, reference = ProtoEncoder(slim=slim), ProtoEncoder(slim=slim)
    for _ in range(2):  # the second time from what the encoder kept
        for event in TURN:
            assert encoder.event_bytes(lane, event) == reference.message_bytes(lane, event)


@pytest.mark.parametrize("event", EVENTS, ids=lambda event: str(event["type"]))
def test_every_event_kind_is_written_as_the_message_path_writes_it(event: JSONObject) -> None:
    for seq in (0, 5, 300, 20_000):
        numbered = {**event, "sequence_number": seq}
        assert ProtoEncoder().event_bytes("a", numbered) == ProtoEncoder().message_bytes(
            "a", numbered
        )


_text = st.text(max_size=40)  # any code point but lone surrogates, which no JSON carries
_index = st.integers(0, 2**31 - 1)


@given(
    item_id=_text,
    output_index=_index,
    content_index=_index,
    delta=_text,
    seq=st.integers(0, 2**63 - 1),
    lane=_text,
)
def test_deltas_and_dones_of_any_content(
    item_id: str, output_index: int, content_index: int, delta: str, seq: int, lane: str
) -> None:
    encoder, reference = ProtoEncoder(), ProtoEncoder()
    events: list[JSONObject] = [
        {
            "type": "response.output_text.delta",
            "item_id": item_id,
            "output_index": output_index,
            "content_index": content_index,
            "delta": delta,
            "sequence_number": seq,
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": item_id,
            "output_index": output_index,
            "delta": delta,
            "sequence_number": seq,
        },
        {
            "type": "response.function_call_arguments.done",
            "item_id": item_id,
            "output_index": output_index,
            "arguments": delta,
            "name": item_id,
            "sequence_number": seq,
        },
        {
            "type": "response.output_item.done",
            "output_index": output_index,
            "item": {
                "type": "message",
                "id": item_id,
                "role": "assistant",
                "status": delta,
                "content": [{"type": "output_text", "text": delta, "annotations": []}],
            },
            "sequence_number": seq,
        },
    ]
    for event in events * 2:
        assert encoder.event_bytes(lane, event) == reference.message_bytes(lane, event)


def test_a_value_the_hand_written_path_cannot_write_gets_the_message_paths_error() -> None:
    bad = {**TURN[5], "output_index": "first"}
    with pytest.raises(TypeError):
        ProtoEncoder().message_bytes("", bad)
    with pytest.raises(TypeError):
        ProtoEncoder().event_bytes("", bad)


def test_an_item_changed_in_place_is_written_anew() -> None:
    encoder = ProtoEncoder()
    event = dict(TURN[-2])
    item = dict(event["item"])
    event["item"] = item
    first = encoder.event_bytes("", event)
    item["arguments"] = '{"path":"elsewhere"}'
    changed = EventDecoder.event(pb.ConnectResponse.FromString(encoder.event_bytes("", event)))
    assert changed["item"]["arguments"] == '{"path":"elsewhere"}'
    assert encoder.event_bytes("", event) != first


def _count_echoes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    built = [0]
    real = response_echo_to_pb

    def counting(r: Any, slim: bool, json_parameters: bool = False) -> pb.Response:
        built[0] += 1
        return real(r, slim, json_parameters)

    monkeypatch.setattr(event_encoder, "response_echo_to_pb", counting)
    return built


def test_an_echo_is_serialized_once_across_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _count_echoes(monkeypatch)
    encoder = ProtoEncoder()
    for turn in range(3):
        for kind, status in (("response.created", "in_progress"), ("response.completed", "x")):
            r = {**response(status, []), "id": f"resp_{turn}"}
            encoder.event_bytes("", {"type": kind, "response": r})
    assert built[0] == 1
    # Another setting or other instructions: another echo, with the new values.
    for change in ({"temperature": 0.5}, {"instructions": "Be brief."}):
        r = {**response("in_progress", []), **change}
        data = encoder.event_bytes("", {"type": "response.created", "response": r})
        read = EventDecoder.event(pb.ConnectResponse.FromString(data))["response"]
        assert {k: read[k] for k in change} == change
    assert built[0] == 3


def test_an_echo_follows_the_streams_delivery_options() -> None:
    encoder = ProtoEncoder()
    created = {"type": "response.created", "response": response("in_progress", [])}
    for slim, json_parameters in ((False, False), (True, False), (False, True), (False, False)):
        encoder.slim, encoder.json_parameters = slim, json_parameters
        data = encoder.event_bytes("", created)
        assert data == ProtoEncoder(slim=slim, json_parameters=json_parameters).message_bytes(
            "", created
        )
        echoed = pb.ConnectResponse.FromString(data).response_created.response
        assert echoed.slim == slim and len(echoed.tools) == (0 if slim else 8)
        for tool in echoed.tools:
            assert bool(tool.function.parameters_json) == json_parameters
            assert tool.function.HasField("parameters") == (not json_parameters)


def test_a_plain_tool_list_is_recognised_by_the_response_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _count_echoes(monkeypatch)
    encoder = ProtoEncoder()
    for turn in range(2):
        r = {**response("in_progress", []), "id": f"resp_{turn}", "tools": []}
        for kind in ("response.created", "response.in_progress"):
            encoder.event_bytes("", {"type": kind, "response": r})
    assert built[0] == 2


def test_echoes_are_bounded_per_stream() -> None:
    encoder = ProtoEncoder()
    for n in range(10):
        tool_list = ToolList([{"type": "function", "name": f"f{n}", "parameters": None}])
        r = {**response("in_progress", []), "tools": tool_list}
        encoder.event_bytes("", {"type": "response.created", "response": r})
    assert len(encoder._echoes) <= event_encoder._MAX_ECHOES


def test_tools_are_read_back_once_and_the_cache_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    converted = [0]
    real = tools.tool_to_dict

    def counting(tool: pb.Tool) -> JSONObject:
        converted[0] += 1
        return real(tool)

    monkeypatch.setattr(tools, "tool_to_dict", counting)
    monkeypatch.setattr(tools, "_read_tools", {})
    monkeypatch.setattr(tools, "_read_tool_bytes", 0)
    messages = [tool_to_pb({"type": "function", "name": "a", "parameters": {"type": "object"}})]
    assert tools_to_dicts(messages) == tools_to_dicts(messages) == [real(messages[0])]
    assert converted[0] == 1
    for n in range(tools._MAX_READ_TOOLS + 10):
        tools_to_dicts([tool_to_pb({"type": "function", "name": f"f{n}"})])
    assert len(tools._read_tools) <= tools._MAX_READ_TOOLS
    assert tools._read_tool_bytes == 2 * sum(len(key) for key in tools._read_tools)


def test_a_creates_tools_are_found_by_the_bytes_they_arrived_in() -> None:
    body = create_body()
    raw = pb.ConnectRequest(stream_id="a", response_create=params_to_pb(body)).SerializeToString()
    keys = ProtoDecoder.tool_keys(raw)
    assert keys is not None and len(keys) == len(body["tools"])
    assert [pb.Tool.FromString(k) for k in keys] == list(
        pb.ConnectRequest.FromString(raw).response_create.tools
    )
    request = pb.ConnectRequest.FromString(raw)
    with_keys = ProtoDecoder.client_event(request, keys)
    assert with_keys == ProtoDecoder.client_event(request)
    assert [t["name"] for t in with_keys["tools"]] == [t["name"] for t in body["tools"]]
    # No tools, another event, or keys that do not match the tools: read as before.
    no_tools = pb.ConnectRequest(response_create=pb.ResponseCreateParams(model="m"))
    assert ProtoDecoder.tool_keys(no_tools.SerializeToString()) is None
    assert ProtoDecoder.tool_keys(b"\xff") is None
    assert ProtoDecoder.client_event(request, keys[:1]) == with_keys


@pytest.mark.parametrize("bad", [1.5, 200.0, 0.0, "3", None, 2**70])
def test_an_index_that_is_not_an_int32_fails_as_the_message_path_fails(bad: object) -> None:
    event = {**TURN[5], "output_index": bad}
    with pytest.raises((TypeError, ValueError)) as reference:
        ProtoEncoder().message_bytes("", event)
    with pytest.raises(type(reference.value)):
        ProtoEncoder().event_bytes("", event)


def test_a_unary_creates_tools_are_found_by_their_bytes_too() -> None:
    body = create_body()
    raw = pb.CreateResponseRequest(params=params_to_pb(body)).SerializeToString()
    keys = ProtoDecoder.tool_keys(raw, unary=True)
    params = pb.CreateResponseRequest.FromString(raw).params
    assert keys is not None
    assert [pb.Tool.FromString(k) for k in keys] == list(params.tools)
    assert ProtoDecoder.params_to_dict(params, keys) == ProtoDecoder.params_to_dict(params)
