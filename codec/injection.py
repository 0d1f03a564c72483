"""Injection (``response.inject``, the hosted beta) and its acknowledgements: JSON <->
``ResponseInject`` and the ``response.inject.created`` / ``.failed`` event messages."""

from __future__ import annotations

from bidi_responses.schema import JSONMapping, JSONObject, JSONValue
from bidi_responses.v1 import responses_pb2 as pb

from .depth import deep
from .items import item_to_dict
from .steering import input_items_to_pb


def inject_to_pb(response_id: str, input: JSONValue) -> pb.ResponseInject:
    """An inject as the ``ConnectRequest.response_inject`` message."""
    return pb.ResponseInject(response_id=response_id, input=input_items_to_pb(input))


def inject_to_dict(inject: pb.ResponseInject) -> JSONObject:
    """A ``ResponseInject`` as the WebSocket-mode client event: exactly ``type``,
    ``response_id`` and ``input``."""
    return {
        "type": "response.inject",
        "response_id": inject.response_id,
        "input": [item_to_dict(i) for i in inject.input],
    }


def inject_created_to_pb(e: JSONMapping, seq: int) -> pb.ResponseInjectCreatedEvent:
    """``response.inject.created`` as its event message."""
    return pb.ResponseInjectCreatedEvent(response_id=e["response_id"], sequence_number=seq)


def inject_created_to_dict(body: pb.ResponseInjectCreatedEvent) -> JSONObject:
    return {"type": "response.inject.created", "response_id": body.response_id}


@deep
def inject_failed_to_pb(e: JSONMapping, seq: int) -> pb.ResponseInjectFailedEvent:
    """``response.inject.failed`` as its event message (the input comes back as Items)."""
    error = e["error"]
    return pb.ResponseInjectFailedEvent(
        response_id=e["response_id"],
        input=input_items_to_pb(e.get("input")),
        error=pb.InjectError(code=error.get("code") or "", message=error.get("message") or ""),
        sequence_number=seq,
    )


def inject_failed_to_dict(body: pb.ResponseInjectFailedEvent) -> JSONObject:
    return {
        "type": "response.inject.failed",
        "response_id": body.response_id,
        "input": [item_to_dict(i) for i in body.input],
        "error": {"code": body.error.code, "message": body.error.message},
    }
