"""Connect's messages become the core's typed client events directly, with exactly the
checks, errors and answers of the JSON path they replace (the WebSocket-mode event the codec
builds, then the core's JSON parser), message by message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from bidi_responses.codec import (
    ProtoDecoder,
    dict_to_struct,
    inject_to_pb,
    item_to_pb,
    params_to_pb,
    steer_to_pb,
)
from bidi_responses.schema import JSONValue
from bidi_responses.server.config import Limits
from bidi_responses.server.core.api.client_events import (
    EventRefused,
    parse_json_event,
)
from bidi_responses.server.core.runs.record import answers_to, error_event
from bidi_responses.server.transports.grpc.connect_events import connect_event
from bidi_responses.server.transports.streams import Incoming, Refusal
from bidi_responses.v1 import responses_pb2 as pb


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels):
        value = {"k": value}
    return value


SHELL = {
    "type": "function",
    "name": "shell",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
DEEP_TOOL = {"type": "function", "name": "deep", "parameters": _deep(31)}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
DEEP_ITEM = pb.Item(other=dict_to_struct({"type": "custom", "value": _deep(31)}))


def _create(**body: Any) -> pb.ResponseCreateParams:
    return params_to_pb({"model": "sim-model", "input": "hi", **body})


REQUESTS = {
    "create": pb.ConnectRequest(response_create=_create()),
    "create on a lane with an event id": pb.ConnectRequest(
        stream_id="lane-1", event_id="evt_1", response_create=_create(tools=[SHELL])
    ),
    "continuation": pb.ConnectRequest(
        event_id="evt_2", response_create=_create(previous_response_id="resp_1")
    ),
    "create too deep": pb.ConnectRequest(
        stream_id="lane-1", event_id="evt_3", response_create=_create(tools=[DEEP_TOOL])
    ),
    "create on a bad lane": pb.ConnectRequest(
        stream_id="bad lane", event_id="evt_4", response_create=_create()
    ),
    "append": pb.ConnectRequest(
        stream_id="a",
        event_id="evt_5",
        response_append=pb.ResponseAppend(response_id="resp_1", input=[item_to_pb(OUTPUT)]),
    ),
    "append without a response id": pb.ConnectRequest(
        stream_id="a", event_id="evt_6", response_append=pb.ResponseAppend()
    ),
    "append too deep": pb.ConnectRequest(
        event_id="evt_7",
        response_append=pb.ResponseAppend(response_id="resp_1", input=[DEEP_ITEM]),
    ),
    "append on a bad lane": pb.ConnectRequest(
        stream_id="x" * 300, response_append=pb.ResponseAppend(response_id="resp_1")
    ),
    "cancel": pb.ConnectRequest(
        event_id="evt_8", response_cancel=pb.ResponseCancel(response_id="resp_1")
    ),
    "cancel of the lane's response": pb.ConnectRequest(
        stream_id="b", response_cancel=pb.ResponseCancel()
    ),
    "cancel on a bad lane": pb.ConnectRequest(
        stream_id="?", event_id="evt_9", response_cancel=pb.ResponseCancel()
    ),
    "steer": pb.ConnectRequest(event_id="evt_10", response_steer=steer_to_pb("resp_1", "tabs")),
    "steer with a lane": pb.ConnectRequest(
        stream_id="a", response_steer=steer_to_pb("resp_1", "tabs")
    ),
    "steer without a target": pb.ConnectRequest(response_steer=steer_to_pb("", "tabs")),
    "inject": pb.ConnectRequest(response_inject=inject_to_pb("resp_1", [OUTPUT])),
    "inject without input": pb.ConnectRequest(response_inject=inject_to_pb("resp_1", [])),
    "no event": pb.ConnectRequest(stream_id="a", event_id="evt_11"),
    "no event on a bad lane": pb.ConnectRequest(stream_id="no way"),
}


def _json_path(request: pb.ConnectRequest, limits: Limits) -> tuple[str, Any]:
    """What the JSON path made of ``request``: the typed event and what its errors answer,
    or the error event it answered with and its lane."""
    event: JSONValue = ProtoDecoder.client_event(request)
    try:
        typed = parse_json_event(event, limits)
    except EventRefused as refused:
        error = refused.error
        return "refused", (
            refused.lane,
            error_event(error.status, error.to_error_object(), answers_to(event)),
        )
    return "typed", (typed, _shown(typed.answers))


def _shown(answers: Mapping[str, object]) -> dict[str, object]:
    """What an error event says it answers (``error_event`` drops what is unset)."""
    return {key: value for key, value in answers.items() if isinstance(value, str) and value}


def _direct(request: pb.ConnectRequest, limits: Limits) -> tuple[str, Any]:
    decoded = connect_event(request, ProtoDecoder.tool_keys(request.SerializeToString()), limits)
    if isinstance(decoded, Refusal):
        assert decoded.fault is None
        return "refused", (decoded.lane, decoded.event())
    assert isinstance(decoded, Incoming)
    typed = decoded.event
    return "typed", (typed, _shown(typed.answers))


@pytest.mark.parametrize("name", list(REQUESTS))
def test_a_connect_message_is_typed_as_its_json_form_would_be(name: str) -> None:
    limits = Limits()
    request = REQUESTS[name]
    assert _direct(request, limits) == _json_path(request, limits)


def test_the_table_covers_refusals_and_typed_events() -> None:
    limits = Limits()
    outcomes = {_direct(request, limits)[0] for request in REQUESTS.values()}
    assert outcomes == {"typed", "refused"}
    # The deep create is refused on the default lane, naming the field, answering its event.
    kind, (lane, event) = _direct(REQUESTS["create too deep"], limits)
    assert (kind, lane) == ("refused", "")
    assert event["error"]["code"] == "nesting_too_deep"
    assert event["error"]["param"].startswith("tools[0].parameters")
    assert event["error"]["event_id"] == "evt_3"
