"""The server's event encoder: the core's JSON-shaped events -> ``ConnectResponse``.

``event_bytes`` is the streaming path: it builds a snapshot's bytes from the response's
progress and a request echo serialized once per response (``codec.wire``), and the tools in
that echo come from the request's ``ToolSet``, converted once per distinct tool list.
"""

from __future__ import annotations

from collections.abc import Callable

from bidi_responses.codec.depth import deep
from bidi_responses.codec.events import (
    CASE_OF_TYPE,
    ITEM_EVENT_TYPES,
    PART_EVENT_TYPES,
    SCALAR_EVENTS,
    SNAPSHOT_TYPES,
    TERMINAL_SNAPSHOT_TYPES,
)
from bidi_responses.codec.injection import inject_created_to_pb, inject_failed_to_pb
from bidi_responses.codec.items import function_call_to_pb, item_to_pb, part_to_pb
from bidi_responses.codec.responses import (
    response_echo_to_pb,
    response_progress_to_pb,
    response_to_pb,
)
from bidi_responses.codec.steering import (
    steer_accepted_to_pb,
    steer_failed_to_pb,
    steer_pending_to_pb,
)
from bidi_responses.codec.structs import JSONMapping
from bidi_responses.codec.wire import VARINT, field_bytes, field_number, tag, varint
from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf.message import Message

_STREAM_ID_FIELD = field_number(pb.ConnectResponse, "stream_id")
_SNAPSHOT_RESPONSE_FIELD = field_number(pb.ResponseSnapshotEvent, "response")
_SNAPSHOT_SEQUENCE = tag(field_number(pb.ResponseSnapshotEvent, "sequence_number"), VARINT)
_SNAPSHOT_FIELDS = {k: field_number(pb.ConnectResponse, CASE_OF_TYPE[k]) for k in SNAPSHOT_TYPES}
# The oneof case is chosen at run time, so the event message is passed by that keyword.
_connect_response: Callable[..., pb.ConnectResponse] = pb.ConnectResponse
# Request echoes kept for responses in flight; more means responses that never ended.
_MAX_ECHOES = 64
# The acknowledgements of steering and injection, each built by its concept's converter.
_ACKNOWLEDGEMENTS: dict[str, Callable[[JSONMapping, int], Message]] = {
    "response.steer.accepted": steer_accepted_to_pb,
    "response.steer.failed": steer_failed_to_pb,
    "response.steer.pending": steer_pending_to_pb,
    "response.inject.created": inject_created_to_pb,
    "response.inject.failed": inject_failed_to_pb,
}


class ProtoEncoder:
    """Encodes the server events of one stream.

    With ``slim``, snapshot events leave out the echoed instructions and tools
    (``SNAPSHOT_DETAIL_SLIM``).
    """

    def __init__(self, *, slim: bool = False) -> None:
        self.slim = slim
        # Serialized request echo per in-flight response id (see ``event_bytes``).
        self._echo: dict[tuple[str, bool], bytes] = {}

    def event_bytes(self, lane: str, e: JSONMapping) -> bytes:
        """A core event as serialized ``ConnectResponse`` bytes (what ``connect_response``
        gives, serialized), building snapshots from a once-per-response request echo."""
        kind = e["type"]
        if kind not in SNAPSHOT_TYPES:
            return self.connect_response(lane, e).SerializeToString()
        return self._snapshot_bytes(lane, kind, e)

    @deep
    def _snapshot_bytes(self, lane: str, kind: str, e: JSONMapping) -> bytes:
        """A snapshot event's bytes: its progress serialized now, its request echo once."""
        r = e["response"]
        key = (r["id"], self.slim)
        echo = self._echo.get(key)
        if echo is None:
            if len(self._echo) >= _MAX_ECHOES:  # responses that never ended (cut-short streams)
                self._echo.clear()
            echo = self._echo[key] = response_echo_to_pb(r, self.slim).SerializeToString()
        if kind in TERMINAL_SNAPSHOT_TYPES:
            del self._echo[key]
        response = response_progress_to_pb(r, self.slim).SerializeToString() + echo
        snapshot = field_bytes(_SNAPSHOT_RESPONSE_FIELD, response)
        seq = e.get("sequence_number", 0)
        if seq:
            snapshot += _SNAPSHOT_SEQUENCE + varint(seq)
        out = field_bytes(_SNAPSHOT_FIELDS[kind], snapshot)
        if lane:
            out = field_bytes(_STREAM_ID_FIELD, lane.encode()) + out
        return out

    @staticmethod
    def response_to_pb(r: JSONMapping, *, slim: bool = False) -> pb.Response:
        """A Response object (``slim``: without the echoed instructions and tools)."""
        return response_to_pb(r, slim=slim)

    def connect_response(self, lane: str, e: JSONMapping) -> pb.ConnectResponse:
        """A core event as a ConnectResponse."""
        kind = e["type"]
        seq = e.get("sequence_number", 0)
        scalar = SCALAR_EVENTS.get(kind)
        if scalar is None:
            return self._composite_response(lane, kind, seq, e)
        # The deltas, the hot path: filled in place, nothing copied, and with no sub-message
        # nothing deep, so no depth limit to lift.
        response = pb.ConnectResponse(stream_id=lane)
        event: Message = getattr(response, CASE_OF_TYPE[kind])
        event.SetInParent()
        for name in scalar:
            setattr(event, name, e[name])
        setattr(event, "sequence_number", seq)  # noqa: B010
        return response

    @deep
    def _composite_response(
        self, lane: str, kind: str, seq: int, e: JSONMapping
    ) -> pb.ConnectResponse:
        """An event that carries messages (a Response, an item, a part, an error)."""
        message: Message
        if kind in SNAPSHOT_TYPES:
            message = pb.ResponseSnapshotEvent(
                response=response_to_pb(e["response"], slim=self.slim), sequence_number=seq
            )
        elif kind in ITEM_EVENT_TYPES:
            message = pb.OutputItemEvent(
                output_index=e["output_index"], item=item_to_pb(e["item"]), sequence_number=seq
            )
        elif kind in PART_EVENT_TYPES:
            message = pb.ContentPartEvent(
                item_id=e["item_id"],
                output_index=e["output_index"],
                content_index=e["content_index"],
                part=part_to_pb(e["part"]),
                sequence_number=seq,
            )
        elif kind == "response.done":
            message = pb.ResponseDoneEvent(
                response=response_to_pb(e["response"], slim=self.slim),
                pending_calls=[function_call_to_pb(c) for c in e["pending_calls"]],
                sequence_number=seq,
            )
        elif kind == "error":
            message = pb.ErrorEvent(
                status=e["status"], error=_error_detail(e["error"]), sequence_number=seq
            )
        elif kind == "warning":
            message = pb.WarningEvent(code=e["code"], message=e["message"])
        elif kind in _ACKNOWLEDGEMENTS:
            message = _ACKNOWLEDGEMENTS[kind](e, seq)
        else:
            raise ValueError(f"no protobuf case for event type {kind!r}")
        return _connect_response(stream_id=lane, **{CASE_OF_TYPE[kind]: message})


def _error_detail(error: JSONMapping) -> pb.ErrorDetail:
    """The nested error object; absent and null members are empty strings."""
    return pb.ErrorDetail(
        type=error.get("type") or "",
        code=error.get("code") or "",
        message=error.get("message") or "",
        param=error.get("param") or "",
        event_id=error.get("event_id") or "",
        request_type=error.get("request_type") or "",
        response_id=error.get("response_id") or "",
    )
