"""Server events: what the server's encoder writes, the client's decoder reads back as the
same JSON event, and the hand-framed bytes are the message the encoder would build."""

from __future__ import annotations

import pytest
from bidi_responses.codec import EventDecoder, JSONObject, ProtoEncoder, unbatch
from bidi_responses.codec.wire import batch_messages
from bidi_responses.v1 import responses_pb2 as pb

FUNCTION_CALL: JSONObject = {
    "type": "function_call",
    "call_id": "c1",
    "name": "sh",
    "arguments": '{"cmd":"ls"}',
    "id": "fc_1",
    "status": "completed",
}
RESPONSE: JSONObject = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1_700_000_000,
    "completed_at": 1_700_000_002,
    "status": "completed",
    "incomplete_details": None,
    "model": "sim-model",
    "previous_response_id": "resp_0",
    "instructions": "Be brief.",
    "output": [FUNCTION_CALL],
    "error": None,
    "tools": [
        {
            "type": "function",
            "name": "sh",
            "description": None,
            "parameters": {"type": "object", "properties": {}},
            "strict": None,
        }
    ],
    "tool_choice": "auto",
    "truncation": "disabled",
    "parallel_tool_calls": True,
    "text": {"format": {"type": "text"}},
    "top_p": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_logprobs": 0,
    "reasoning": None,
    "usage": {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    },
    "max_output_tokens": None,
    "max_tool_calls": None,
    "store": True,
    "background": False,
    "service_tier": "default",
    "safety_identifier": None,
    "prompt_cache_key": None,
    "metadata": {"run": "1"},
    "safety_flags": [{"classifier": "c", "code": "x", "param": "input", "message": "m"}],
}
FAILED: JSONObject = {
    **RESPONSE,
    "status": "failed",
    "error": {"code": "server_error", "message": "boom"},
    "incomplete_details": None,
}
INCOMPLETE: JSONObject = {
    **RESPONSE,
    "status": "incomplete",
    "incomplete_details": {"reason": "max_output_tokens"},
}
STEERED: JSONObject = {
    **RESPONSE,
    "status": "incomplete",
    "incomplete_details": {"reason": "steered"},
}
STEER_INPUT: list[JSONObject] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "use tabs"}]}
]
#: The acknowledgements of steering and injection, as the official SDKs type them.
STEER_EVENTS: list[JSONObject] = [
    {"type": "response.steer.accepted", "steer": {"id": "steer_1", "previous_response_id": "r1"}},
    {
        "type": "response.steer.failed",
        "steer": {"previous_response_id": "r1", "input": STEER_INPUT},
        "error": {
            "code": "invalid_input",
            "message": "Invalid 'input[0].role': steering accepts only the 'user' role.",
            "type": "invalid_request_error",
        },
    },
    {
        "type": "response.steer.failed",
        "steer": {"previous_response_id": "r1", "input": STEER_INPUT, "id": "steer_2"},
        "error": {
            "code": "successor_creation_failed",
            "message": "m",
            "type": "invalid_request_error",
        },
    },
    {
        "type": "response.steer.pending",
        "steer": {"id": "steer_3", "previous_response_id": "r1"},
        "reason": "waiting_for_required_input",
        "required_input": [
            {"type": "function_call_output", "call_id": "c1", "name": "sh"},
            {"type": "custom_tool_call_output", "call_id": "c2"},
        ],
    },
    {"type": "response.inject.created", "response_id": "r1"},
    {
        "type": "response.inject.failed",
        "response_id": "r1",
        "input": [{"type": "function_call_output", "call_id": "c1", "output": "ok"}],
        "error": {"code": "response_not_found", "message": "m"},
    },
]

EVENTS: list[JSONObject] = [
    {"type": "response.created", "response": {**RESPONSE, "status": "in_progress"}},
    {"type": "response.in_progress", "response": {**RESPONSE, "status": "in_progress"}},
    {"type": "response.output_item.added", "output_index": 0, "item": FUNCTION_CALL},
    {
        "type": "response.content_part.added",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "part": {"type": "output_text", "text": "", "annotations": []},
    },
    {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "delta": "Hel",
    },
    {
        "type": "response.output_text.done",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "text": "Hello",
    },
    {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_1",
        "output_index": 0,
        "delta": '{"cmd"',
    },
    {
        "type": "response.function_call_arguments.done",
        "item_id": "fc_1",
        "output_index": 0,
        "arguments": '{"cmd":"ls"}',
        "name": "sh",
    },
    {"type": "response.output_item.done", "output_index": 0, "item": FUNCTION_CALL},
    {"type": "response.done", "response": RESPONSE, "pending_calls": [FUNCTION_CALL]},
    {"type": "response.completed", "response": RESPONSE},
    {"type": "response.failed", "response": FAILED},
    {"type": "response.incomplete", "response": INCOMPLETE},
    {"type": "response.incomplete", "response": STEERED},
    {"type": "response.queued", "response": {**RESPONSE, "status": "queued"}},
    *STEER_EVENTS,
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda event: str(event["type"]))
@pytest.mark.parametrize("lane", ["", "lane-a"])
def test_event_round_trip(event: JSONObject, lane: str) -> None:
    numbered = {**event, "sequence_number": 7}
    message = ProtoEncoder().connect_response(lane, numbered)
    expected = {**numbered, "stream_id": lane} if lane else numbered
    assert EventDecoder.event(message) == expected


@pytest.mark.parametrize("event", EVENTS, ids=lambda event: str(event["type"]))
@pytest.mark.parametrize("sequence_number", [0, 300])
def test_event_bytes_are_the_encoders_message(event: JSONObject, sequence_number: int) -> None:
    numbered = {**event, "sequence_number": sequence_number}
    for slim in (False, True):
        data = ProtoEncoder(slim=slim).event_bytes("lane-a", numbered)
        built = ProtoEncoder(slim=slim).connect_response("lane-a", numbered)
        assert pb.ConnectResponse.FromString(data) == built


def test_slim_snapshots_leave_the_echoed_instructions_and_tools_out() -> None:
    data = ProtoEncoder(slim=True).event_bytes(
        "", {"type": "response.completed", "response": RESPONSE}
    )
    response = pb.ConnectResponse.FromString(data).response_completed.response
    assert response.slim
    assert not response.tools
    assert not response.HasField("instructions")
    assert response.model == "sim-model"


def test_a_snapshot_echo_follows_each_response() -> None:
    """The echo is serialized once per response, and a new response gets its own."""
    encoder = ProtoEncoder()
    for model in ("first", "second"):
        created = {**RESPONSE, "id": f"resp_{model}", "model": model, "status": "in_progress"}
        for kind in ("response.created", "response.completed"):
            data = encoder.event_bytes("", {"type": kind, "response": created})
            assert (
                EventDecoder.event(pb.ConnectResponse.FromString(data))["response"]["model"]
                == model
            )


def test_errors_and_warnings() -> None:
    error: JSONObject = {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": None,
            "message": "Missing required parameter: 'model'.",
            "param": "model",
            "event_id": "e1",
            "request_type": "response.create",
        },
    }
    encoder = ProtoEncoder()
    assert EventDecoder.event(encoder.connect_response("a", error)) == {**error, "stream_id": "a"}
    warning: JSONObject = {"type": "warning", "code": "slow", "message": "m"}
    assert EventDecoder.event(encoder.connect_response("", warning)) == warning
    with pytest.raises(ValueError, match="no protobuf case"):
        encoder.connect_response("", {"type": "response.unknown"})


def test_batched_events_read_back_in_order() -> None:
    encoder = ProtoEncoder()
    deltas = [{**EVENTS[4], "delta": str(i), "sequence_number": i} for i in range(5)]
    messages = batch_messages([encoder.event_bytes("", d) for d in deltas], 3, 1 << 20)
    assert len(messages) == 2
    read = [
        EventDecoder.event(event)
        for data in messages
        for event in unbatch(pb.ConnectResponse.FromString(data))
    ]
    assert read == deltas
