"""Create parameters and client events: what the client encodes, the server decodes."""

from __future__ import annotations

from bidi_responses.codec import JSONObject, ProtoDecoder, item_to_pb, params_to_dict, params_to_pb
from bidi_responses.v1 import responses_pb2 as pb

from tests.codec.headline_turn import create_body

BODY: JSONObject = {
    "model": "sim-model",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ],
    "tools": [{"type": "function", "name": "sh", "parameters": {"type": "object"}}],
    "tool_choice": {"type": "function", "name": "sh"},
    "instructions": "Be brief.",
    "previous_response_id": "resp_1",
    "store": False,
    "max_output_tokens": 64,
    "temperature": 0.5,
    "top_p": 0.9,
    "parallel_tool_calls": False,
    "generate": True,
    "append_mode": True,
    "safety_identifier": "user-1",
    "prompt_cache_key": "k",
    "user": "u",
    "truncation": "auto",
    "max_tool_calls": 3,
    "background": False,
    "idempotency_key": "turn-1",
    "metadata": {"run": "7"},
    "text": {"format": {"type": "text"}, "verbosity": "medium"},
    "reasoning": {"effort": "low", "summary": None},
    "include": ["reasoning.encrypted_content"],
}


def test_every_parameter_round_trips() -> None:
    assert params_to_dict(params_to_pb(BODY)) == BODY


def test_absent_parameters_stay_absent() -> None:
    assert params_to_dict(params_to_pb({"model": "m"})) == {"model": "m", "input": []}


def test_string_input_and_shorthand_items_are_expanded() -> None:
    decoded = params_to_dict(params_to_pb({"model": "m", "input": "hi", "tool_choice": "none"}))
    assert decoded["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ]
    assert decoded["tool_choice"] == "none"


def test_client_events_carry_their_lane_and_event_id() -> None:
    create = pb.ConnectRequest(
        stream_id="a", event_id="e1", response_create=params_to_pb({"model": "m"})
    )
    assert ProtoDecoder.client_event(create) == {
        "model": "m",
        "input": [],
        "type": "response.create",
        "stream_id": "a",
        "event_id": "e1",
    }
    output = {"type": "function_call_output", "call_id": "c", "output": "ok"}
    append = pb.ConnectRequest(
        response_append=pb.ResponseAppend(response_id="resp_1", input=[item_to_pb(output)])
    )
    assert ProtoDecoder.client_event(append) == {
        "type": "response.append",
        "response_id": "resp_1",
        "input": [output],
    }
    cancel = pb.ConnectRequest(response_cancel=pb.ResponseCancel(response_id="resp_1"))
    assert ProtoDecoder.client_event(cancel) == {"type": "response.cancel", "response_id": "resp_1"}
    assert ProtoDecoder.client_event(pb.ConnectRequest()) == {}


def test_parameters_built_in_place_are_the_parameters_built_alone() -> None:
    for body in (create_body(), {}):
        request = pb.ConnectRequest(stream_id="a")
        params_to_pb(body, into=request.response_create)
        assert request.WhichOneof("event") == "response_create"
        assert request.response_create == params_to_pb(body)
