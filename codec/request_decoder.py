"""The server's request decoder: ``ConnectRequest`` -> the WebSocket-mode client event.

Stateless: a stream sends the same tools every turn, and the core reuses the lane's
``ToolSet`` when the decoded list has the same fingerprint.
"""

from __future__ import annotations

from bidi_responses.codec.injection import inject_to_dict
from bidi_responses.codec.items import item_to_dict
from bidi_responses.codec.params import params_to_dict
from bidi_responses.codec.steering import steer_to_dict
from bidi_responses.codec.structs import JSONObject
from bidi_responses.v1 import responses_pb2 as pb


class ProtoDecoder:
    """Decodes the client messages of a stream into the core's JSON-shaped events."""

    @staticmethod
    def params_to_dict(params: pb.ResponseCreateParams) -> JSONObject:
        """Create parameters as the POST /v1/responses body (absent fields left out)."""
        return params_to_dict(params)

    @staticmethod
    def client_event(request: pb.ConnectRequest) -> JSONObject:
        """A ConnectRequest as the WebSocket-mode client event (``{}`` when none is set)."""
        kind = request.WhichOneof("event")
        event: JSONObject
        if kind == "response_create":
            event = params_to_dict(request.response_create)
            event["type"] = "response.create"
        elif kind == "response_append":
            event = {
                "type": "response.append",
                "response_id": request.response_append.response_id,
                "input": [item_to_dict(i) for i in request.response_append.input],
            }
        elif kind == "response_cancel":
            event = {"type": "response.cancel", "response_id": request.response_cancel.response_id}
        elif kind == "response_steer" or kind == "response_inject":
            # WebSocket mode's exact shape: the answers name the target, so no event_id; a
            # lane given on the envelope is passed on for the core to refuse, as it would be
            # over WebSocket (the target's lane is used).
            event = (
                steer_to_dict(request.response_steer)
                if kind == "response_steer"
                else inject_to_dict(request.response_inject)
            )
            if request.stream_id:
                event["stream_id"] = request.stream_id
            return event
        else:
            event = {}
        if request.stream_id:
            event["stream_id"] = request.stream_id
        if request.event_id:
            event["event_id"] = request.event_id
        return event
