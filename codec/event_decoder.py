"""The client's event decoder: ``ConnectResponse`` -> the JSON events a WebSocket client sees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bidi_responses.schema import JSONObject, ResponseObject
from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf.message import Message

from .events import (
    ITEM_EVENT_TYPES,
    PART_EVENT_FIELDS,
    PART_EVENT_TYPES,
    SCALAR_EVENTS,
    SNAPSHOT_TYPES,
    TYPE_OF_CASE,
)
from .injection import inject_created_to_dict, inject_failed_to_dict
from .items import function_call_to_dict, item_to_dict, part_to_dict
from .responses import response_to_dict
from .steering import (
    steer_accepted_to_dict,
    steer_failed_to_dict,
    steer_pending_to_dict,
)

# Which request an error answers: present in the JSON error only when known (as over WebSocket).
_ERROR_ANSWERS = ("event_id", "request_type", "response_id")
# The acknowledgements of steering and injection, each read by its concept's converter.
_ACKNOWLEDGEMENTS: dict[str, Callable[[Any], JSONObject]] = {
    "response.steer.accepted": steer_accepted_to_dict,
    "response.steer.failed": steer_failed_to_dict,
    "response.steer.pending": steer_pending_to_dict,
    "response.inject.created": inject_created_to_dict,
    "response.inject.failed": inject_failed_to_dict,
}


class EventDecoder:
    """Decodes ConnectResponse messages into the JSON events a WebSocket client would see."""

    @staticmethod
    def response(r: pb.Response) -> ResponseObject:
        """A Response message as the JSON Response object."""
        return response_to_dict(r)

    @staticmethod
    def event(message: pb.ConnectResponse) -> JSONObject:
        """A ConnectResponse as the JSON event (``stream_id`` included when set)."""
        case = message.WhichOneof("event")
        if case is None:
            return {"type": "", "stream_id": message.stream_id}
        event = _event_body(TYPE_OF_CASE.get(case, case), getattr(message, case))
        if message.stream_id:
            event["stream_id"] = message.stream_id
        return event


def _event_body(kind: str, body: Message) -> JSONObject:
    """The JSON event of one oneof case's message (``sequence_number`` last, when it has one)."""
    scalar = SCALAR_EVENTS.get(kind)
    event: JSONObject
    if scalar is not None:  # the deltas: the client's hot path
        event = {"type": kind}
        for name in scalar:
            event[name] = getattr(body, name)
    elif kind in SNAPSHOT_TYPES:
        assert isinstance(body, pb.ResponseSnapshotEvent)
        event = {"type": kind, "response": response_to_dict(body.response)}
    elif kind in ITEM_EVENT_TYPES:
        assert isinstance(body, pb.OutputItemEvent)
        event = {"type": kind, "output_index": body.output_index, "item": item_to_dict(body.item)}
    elif kind in PART_EVENT_TYPES:
        assert isinstance(body, pb.ContentPartEvent)
        event = {"type": kind, **{name: getattr(body, name) for name in PART_EVENT_FIELDS}}
        event["part"] = part_to_dict(body.part)
    elif kind == "response.done":
        assert isinstance(body, pb.ResponseDoneEvent)
        event = {
            "type": kind,
            "response": response_to_dict(body.response),
            "pending_calls": [function_call_to_dict(c) for c in body.pending_calls],
        }
    elif kind == "error":
        assert isinstance(body, pb.ErrorEvent)
        return {"type": "error", "status": body.status, "error": _error_to_dict(body.error)}
    elif kind in _ACKNOWLEDGEMENTS:
        event = _ACKNOWLEDGEMENTS[kind](body)
    else:
        assert isinstance(body, pb.WarningEvent)
        return {"type": "warning", "code": body.code, "message": body.message}
    event["sequence_number"] = getattr(body, "sequence_number")  # noqa: B009
    return event


def _error_to_dict(error: pb.ErrorDetail) -> JSONObject:
    """The nested error object; empty members are null, unknown answers left out."""
    result: JSONObject = {
        "type": error.type,
        "code": error.code or None,
        "message": error.message,
        "param": error.param or None,
    }
    for name in _ERROR_ANSWERS:
        value = getattr(error, name)
        if value:
            result[name] = value
    return result
