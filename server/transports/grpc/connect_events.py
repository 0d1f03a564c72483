"""A ``ConnectRequest`` as the core's typed client event, with WebSocket mode's checks.

Protobuf decodes straight into ``CreateEvent``, ``AppendEvent`` and ``CancelEvent``: the
create body and the appended items come from the codec's converters, and the checks a JSON
event passes (nesting and numbers, the ``stream_id`` rule, a missing ``response_id``) run on
them here, with the same errors, answering the same ``event_id``. Steers, injects and a message
that sets no event are rarer, and take WebSocket mode's shape through the one JSON parser
(``parse_json_event``), so they are refused exactly as they are there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from bidi_responses.codec import inject_to_dict, item_to_dict, params_to_dict, steer_to_dict
from bidi_responses.schema import JSONObject, JSONValue
from bidi_responses.v1 import responses_pb2 as pb

from ...config import Limits
from ...core.api import (
    ApiError,
    AppendEvent,
    CancelEvent,
    CreateEvent,
    EventRefused,
    answering,
    check_json_shape,
    lane_named,
    parse_json_event,
    server_error,
)
from ...core.runs import answers_to
from ..streams import Incoming, Refusal


def connect_event(
    request: pb.ConnectRequest, tool_keys: Sequence[bytes] | None, limits: Limits
) -> Incoming | Refusal:
    """The typed event of ``request``, or the error that refuses it (on the lane it goes to);
    ``tool_keys``: the create's tools as they arrived (``ProtoDecoder.tool_keys``)."""
    kind = request.WhichOneof("event")
    try:
        if kind == "response_create":
            return _create(request, tool_keys)
        if kind == "response_append":
            return _append(request)
        if kind == "response_cancel":
            return _cancel(request)
        return _as_json(request, kind, limits)
    except Exception as fault:
        return Refusal("", server_error(), _answers(request, kind), fault)


def _create(request: pb.ConnectRequest, tool_keys: Sequence[bytes] | None) -> Incoming | Refusal:
    body = params_to_dict(request.response_create, tool_keys)
    if request.event_id:
        body["event_id"] = request.event_id
    try:
        # Nesting and numbers first (the lane is in doubt until its rule is checked).
        check_json_shape(body)
        lane = lane_named(request.stream_id)
    except ApiError as error:
        return Refusal("", error, CreateEvent("", body).answers)
    # Its errors answer the body's event_id and previous_response_id (CreateEvent.answers).
    return Incoming(CreateEvent(lane, body))


def _append(request: pb.ConnectRequest) -> Incoming | Refusal:
    append = request.response_append
    event_id = request.event_id or None
    answers = answering("response.append", event_id, append.response_id or None)
    items: list[JSONValue] = [cast(JSONValue, item_to_dict(i)) for i in append.input]
    try:
        # As the JSON event nests them: the items at level 2, named input[i].
        check_json_shape({"input": items})
        lane = lane_named(request.stream_id)
    except ApiError as error:
        return Refusal("", error, answers)
    if not append.response_id:
        missing = ApiError(
            "Missing required parameter: 'response_id'.",
            code="missing_required_parameter",
            param="response_id",
        )
        return Refusal(lane, missing, answers)
    return Incoming(AppendEvent(lane, append.response_id, items, event_id))


def _cancel(request: pb.ConnectRequest) -> Incoming | Refusal:
    response_id = request.response_cancel.response_id or None
    event_id = request.event_id or None
    try:
        lane = lane_named(request.stream_id)
    except ApiError as error:
        return Refusal("", error, answering("response.cancel", event_id, response_id))
    return Incoming(CancelEvent(lane, response_id, event_id))


def _as_json(request: pb.ConnectRequest, kind: str | None, limits: Limits) -> Incoming | Refusal:
    """A steer, an inject or no event at all, through WebSocket mode's shape and parser: the
    answers of steers and injects name their target, so no ``event_id``; a lane given on the
    envelope is passed on to be refused, as it is over WebSocket (the target's lane is
    used)."""
    event: JSONObject
    if kind == "response_steer":
        event = steer_to_dict(request.response_steer)
    elif kind == "response_inject":
        event = inject_to_dict(request.response_inject)
    else:
        event = {}
    if request.stream_id:
        event["stream_id"] = request.stream_id
    if kind is None and request.event_id:
        event["event_id"] = request.event_id
    try:
        return Incoming(parse_json_event(event, limits))
    except EventRefused as refused:
        return Refusal(refused.lane, refused.error, answers_to(event), refused.__cause__)


def _answers(request: pb.ConnectRequest, kind: str | None) -> dict[str, object]:
    """What an error about ``request`` answers, from its envelope alone."""
    names = {"response_create": "response.create", "response_append": "response.append"}
    answers: dict[str, object] = {"event_id": request.event_id}
    if kind is not None:
        answers["request_type"] = names.get(kind, kind.replace("_", "."))
    return answers
