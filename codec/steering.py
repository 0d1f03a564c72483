"""Steering (``response.steer``) and its acknowledgements: JSON <-> ``ResponseSteer`` and the
``response.steer.accepted`` / ``.failed`` / ``.pending`` event messages.

A steer's ``input`` is a string or a list of user messages in JSON and a list of ``Item`` in
protobuf: a string travels as one user message. The input a failed steer returns is what the
client sent; it is converted item by item, and an entry that is not a well-formed item travels
whole as ``Item.other`` so nothing the client sent is dropped.
"""

from __future__ import annotations

from bidi_responses.schema import JSONMapping, JSONObject, JSONValue
from bidi_responses.v1 import responses_pb2 as pb

from .depth import deep
from .items import canonical_item, item_to_dict, item_to_pb
from .structs import dict_to_struct


def input_items_to_pb(raw: JSONValue) -> list[pb.Item]:
    """Steering or injected input as Items: a string is one user message; an entry that is
    not a well-formed item travels whole as ``Item.other`` (as ``{"value": entry}`` when it is
    not even an object)."""
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list):
        return []
    items = []
    for entry in raw:
        if not isinstance(entry, dict):
            items.append(pb.Item(other=dict_to_struct({"value": entry})))
            continue
        try:
            items.append(item_to_pb(canonical_item(entry)))
        except (KeyError, TypeError, AttributeError, ValueError):
            items.append(pb.Item(other=dict_to_struct(entry)))
    return items


# -- the client's request ---------------------------------------------------------------------


def steer_to_pb(previous_response_id: str, input: JSONValue) -> pb.ResponseSteer:
    """A steer as the ``ConnectRequest.response_steer`` message."""
    return pb.ResponseSteer(
        previous_response_id=previous_response_id, input=input_items_to_pb(input)
    )


def steer_to_dict(steer: pb.ResponseSteer) -> JSONObject:
    """A ``ResponseSteer`` as the WebSocket-mode client event: exactly ``type``,
    ``previous_response_id`` and ``input``."""
    return {
        "type": "response.steer",
        "previous_response_id": steer.previous_response_id,
        "input": [item_to_dict(i) for i in steer.input],
    }


# -- the server's events ------------------------------------------------------------------------


def steer_ref_to_dict(ref: pb.SteerRef) -> JSONObject:
    return {"id": ref.id, "previous_response_id": ref.previous_response_id}


def steer_ref_to_pb(ref: JSONMapping) -> pb.SteerRef:
    return pb.SteerRef(id=ref["id"], previous_response_id=ref["previous_response_id"])


def steer_accepted_to_pb(e: JSONMapping, seq: int) -> pb.ResponseSteerAcceptedEvent:
    """``response.steer.accepted`` as its event message."""
    return pb.ResponseSteerAcceptedEvent(steer=steer_ref_to_pb(e["steer"]), sequence_number=seq)


def steer_accepted_to_dict(body: pb.ResponseSteerAcceptedEvent) -> JSONObject:
    return {"type": "response.steer.accepted", "steer": steer_ref_to_dict(body.steer)}


@deep
def steer_failed_to_pb(e: JSONMapping, seq: int) -> pb.ResponseSteerFailedEvent:
    """``response.steer.failed`` as its event message (the input comes back as Items)."""
    steer, error = e["steer"], e["error"]
    failed = pb.FailedSteer(
        previous_response_id=steer.get("previous_response_id") or "",
        input=input_items_to_pb(steer.get("input")),
    )
    if "id" in steer:
        failed.id = steer["id"]
    return pb.ResponseSteerFailedEvent(
        steer=failed,
        error=pb.SteerError(
            code=error.get("code") or "",
            message=error.get("message") or "",
            type=error.get("type") or "invalid_request_error",
        ),
        sequence_number=seq,
    )


def steer_failed_to_dict(body: pb.ResponseSteerFailedEvent) -> JSONObject:
    steer: JSONObject = {
        "previous_response_id": body.steer.previous_response_id,
        "input": [item_to_dict(i) for i in body.steer.input],
    }
    if body.steer.HasField("id"):
        steer["id"] = body.steer.id
    error = body.error
    return {
        "type": "response.steer.failed",
        "steer": steer,
        "error": {"code": error.code, "message": error.message, "type": error.type},
    }


def required_input_to_pb(stub: JSONMapping) -> pb.SteerRequiredInput:
    required = pb.SteerRequiredInput(type=stub["type"], call_id=stub.get("call_id") or "")
    if stub.get("name") is not None:
        required.name = stub["name"]
    return required


def required_input_to_dict(stub: pb.SteerRequiredInput) -> JSONObject:
    result: JSONObject = {"type": stub.type, "call_id": stub.call_id}
    if stub.HasField("name"):
        result["name"] = stub.name
    return result


def steer_pending_to_pb(e: JSONMapping, seq: int) -> pb.ResponseSteerPendingEvent:
    """``response.steer.pending`` as its event message."""
    return pb.ResponseSteerPendingEvent(
        steer=steer_ref_to_pb(e["steer"]),
        reason=e["reason"],
        required_input=[required_input_to_pb(s) for s in e["required_input"]],
        sequence_number=seq,
    )


def steer_pending_to_dict(body: pb.ResponseSteerPendingEvent) -> JSONObject:
    return {
        "type": "response.steer.pending",
        "steer": steer_ref_to_dict(body.steer),
        "reason": body.reason,
        "required_input": [required_input_to_dict(s) for s in body.required_input],
    }
