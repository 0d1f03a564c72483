"""The server's event encoder: the core's JSON-shaped events -> ``ConnectResponse``.

``event_bytes`` is the streaming path: a turn's events are written by hand
(``codec.turn_bytes``), a snapshot from the response's progress and a request echo serialized
once while its values stay the same (across turns), whose tools come from the request's
``ToolSet``, converted once per distinct tool list. ``message_bytes`` is the same output
built as messages: the reference, and the path for values the hand-written one refuses.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

from bidi_responses.schema import JSONMapping
from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf.message import Message

from .depth import deep, deep_messages
from .events import (
    CASE_OF_TYPE,
    ITEM_EVENT_TYPES,
    PART_EVENT_TYPES,
    SCALAR_EVENTS,
    SNAPSHOT_TYPES,
)
from .injection import inject_created_to_pb, inject_failed_to_pb
from .items import function_call_to_pb, item_to_pb, part_to_pb
from .responses import (
    response_echo_to_pb,
    response_progress_to_pb,
    response_to_pb,
)
from .steering import (
    steer_accepted_to_pb,
    steer_failed_to_pb,
    steer_pending_to_pb,
)
from .turn_bytes import TurnWriter
from .wire import (
    LENGTH_DELIMITED,
    VARINT,
    field_bytes,
    field_number,
    tag,
    varint,
)

_STREAM_ID_FIELD = field_number(pb.ConnectResponse, "stream_id")
_SNAPSHOT_RESPONSE_FIELD = field_number(pb.ResponseSnapshotEvent, "response")
_SNAPSHOT_RESPONSE_TAG = tag(_SNAPSHOT_RESPONSE_FIELD, LENGTH_DELIMITED)
_SNAPSHOT_SEQUENCE = tag(field_number(pb.ResponseSnapshotEvent, "sequence_number"), VARINT)
_SNAPSHOT_FIELDS = {k: field_number(pb.ConnectResponse, CASE_OF_TYPE[k]) for k in SNAPSHOT_TYPES}
# The oneof case is chosen at run time, so the event message is passed by that keyword.
_connect_response: Callable[..., pb.ConnectResponse] = pb.ConnectResponse
# Request echoes kept per stream: a stream's lanes in flight mostly share one (bounded also
# by bytes, though the echo in use is always kept).
_MAX_ECHOES = 4
_MAX_ECHO_BYTES = 1 << 20
# A hand-written event's writer: (the message's lead, the event) -> the message.
_Writer = Callable[[bytes, JSONMapping], bytes]
# Lanes whose leads are kept per stream (see ``_leads_of``).
_MAX_LANES = 16
# The field of each event type's case in ``ConnectResponse``, as an encoded key.
_CASE_TAGS = {
    kind: tag(field_number(pb.ConnectResponse, case), LENGTH_DELIMITED)
    for kind, case in CASE_OF_TYPE.items()
}
# The echoed fields besides the tools, compared to recognise an echo.
_ECHO_SETTINGS = (
    "model",
    "tool_choice",
    "truncation",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "store",
    "background",
    "service_tier",
    "metadata",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "text",
    "reasoning",
    "max_output_tokens",
    "safety_identifier",
    "prompt_cache_key",
    "max_tool_calls",
    "instructions",
)


_settings_of = operator.itemgetter(*_ECHO_SETTINGS)


def _echo_settings(r: JSONMapping) -> tuple[object, ...]:
    """The echoed settings of ``r`` (absent ones as None); ``_settings_of`` when all are
    there."""
    get = r.get
    return tuple([get(name) for name in _ECHO_SETTINGS])


@dataclass(frozen=True, slots=True)
class _Echo:
    """One serialized request echo and the values it was built from. ``owner`` is the tool
    list (kept alive here, so its identity is not reused) or, for a plain list, the response
    id."""

    owner: object
    #: The echoed values besides the tools (``_ECHO_SETTINGS``).
    settings: tuple[object, ...]
    #: The encoder's ``slim`` and ``json_parameters`` when it was built.
    form: tuple[bool, bool]
    data: bytes


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
    (``SNAPSHOT_DETAIL_SLIM``); with ``json_parameters``, the echoed function tools carry
    their schemas as JSON text (``FunctionTool.parameters_json``) instead of Structs.
    Both may change between events (``DeliveryOptions`` apply from the next event on).
    """

    def __init__(self, *, slim: bool = False, json_parameters: bool = False) -> None:
        self.slim = slim
        self.json_parameters = json_parameters
        # Serialized request echoes, most recent first (see ``_echo_bytes``).
        self._echoes: list[_Echo] = []
        self._writer = writer = TurnWriter()
        # The events written by hand: JSON type -> the writer of its whole message (None
        # for a snapshot: ``_snapshot_event``, which a bound method here would tie to this
        # encoder in a reference cycle, keeping its echoes alive until a full collection).
        self._writers: dict[str, _Writer | None] = {
            "response.output_text.delta": writer.text_delta_event,
            "response.function_call_arguments.delta": writer.arguments_delta_event,
            "response.output_text.done": writer.text_done_event,
            "response.function_call_arguments.done": writer.arguments_done_event,
            **dict.fromkeys(PART_EVENT_TYPES, writer.part_event),
            **dict.fromkeys(ITEM_EVENT_TYPES, writer.item_event),
            **dict.fromkeys(SNAPSHOT_TYPES),
        }
        # Per lane, each hand-written event type's writer and what its messages begin
        # with: the lane's ``stream_id`` field and the event's key (the current lane's in
        # ``_leads``).
        self._lane_leads: dict[str, dict[str, tuple[_Writer | None, bytes]]] = {}
        self._lane = ""
        self._leads = self._leads_of("")

    def event_bytes(self, lane: str, e: JSONMapping) -> bytes:
        """A core event as serialized ``ConnectResponse`` bytes (what ``connect_response``
        gives, serialized), written by hand for a turn's events (``codec.turn_bytes``) and
        building snapshots from a request echo serialized once (see ``_echo_bytes``)."""
        if lane != self._lane:
            self._leads = self._leads_of(lane)
            self._lane = lane
        try:  # (a subscript: ``get`` costs a call on every event)
            write, lead = self._leads[e["type"]]
        except KeyError:  # not written by hand: built as a message
            return self.connect_response(lane, e).SerializeToString()
        try:
            if write is None:
                return self._snapshot_event(lead, e)
            return write(lead, e)
        except (TypeError, KeyError, AttributeError, ValueError):
            # A value the hand-written path cannot write: the message path names it.
            return self.message_bytes(lane, e)

    def _leads_of(self, lane: str) -> dict[str, tuple[_Writer | None, bytes]]:
        """The writers of ``lane``'s events, each with what its messages begin with: the
        lane's ``stream_id`` field (none for the default lane) and the event's key. Built
        once per lane (a stream has a few)."""
        leads = self._lane_leads.get(lane)
        if leads is None:
            lane_field = field_bytes(_STREAM_ID_FIELD, lane.encode()) if lane else b""
            leads = {
                kind: (write, lane_field + _CASE_TAGS[kind])
                for kind, write in self._writers.items()
            }
            if len(self._lane_leads) >= _MAX_LANES:
                self._lane_leads.clear()
            self._lane_leads[lane] = leads
        return leads

    def message_bytes(self, lane: str, e: JSONMapping) -> bytes:
        """``event_bytes`` by the message path: each event built as messages, then
        serialized (the reference the hand-written bytes are tested against)."""
        kind = e["type"]
        if kind not in SNAPSHOT_TYPES:
            return self.connect_response(lane, e).SerializeToString()
        r = e["response"]
        with deep_messages():
            response = (
                response_progress_to_pb(r, self.slim).SerializeToString()
                + response_echo_to_pb(r, self.slim, self.json_parameters).SerializeToString()
            )
        snapshot = field_bytes(_SNAPSHOT_RESPONSE_FIELD, response)
        seq = e.get("sequence_number", 0)
        if seq:
            snapshot += _SNAPSHOT_SEQUENCE + varint(seq)
        out = field_bytes(_SNAPSHOT_FIELDS[kind], snapshot)
        if lane:
            out = field_bytes(_STREAM_ID_FIELD, lane.encode()) + out
        return out

    def _snapshot_event(self, lead: bytes, e: JSONMapping) -> bytes:
        """A snapshot event: the response's progress written now, its echo reused, the whole
        joined once (an echo is kilobytes: each concatenation would copy it)."""
        r = e["response"]
        progress = self._writer.response_progress(r, self.slim)
        echo = self._echo_bytes(r)
        size = len(progress) + len(echo)
        response_length = varint(size)
        size += len(_SNAPSHOT_RESPONSE_TAG) + len(response_length)
        seq = e.get("sequence_number", 0)
        tail = _SNAPSHOT_SEQUENCE + varint(seq) if seq else b""
        size += len(tail)
        return b"".join(
            (lead, varint(size), _SNAPSHOT_RESPONSE_TAG, response_length, progress, echo, tail)
        )

    def _echo_bytes(self, r: JSONMapping) -> bytes:
        """The serialized request echo of ``r``, reused while its values stay the same.

        An echo is the same for every snapshot of a response and, in an agent loop, for
        every turn: the same instructions, settings and tools. The core hands the encoder
        its checked tool list (``ProtoTools``), the same object while a lane's tools do not
        change, so an echo is recognised by that object and the equal values of the other
        fields, compared rather than hashed. A plain tool list is recognised by the
        response id, as before. The last few echoes are kept, bounded by count and bytes.
        """
        tools = r["tools"]
        # (A class check: ``isinstance`` on a runtime Protocol costs microseconds.)
        owner: object = tools if hasattr(type(tools), "protobuf") else r["id"]
        try:
            settings: tuple[object, ...] = _settings_of(r)  # the core's responses have them all
        except KeyError:
            settings = _echo_settings(r)
        form = (self.slim, self.json_parameters)
        for entry in self._echoes:
            # Tuples compare element by element, each by identity first: the same request's
            # values compare at once.
            if (
                (entry.owner is owner or (type(owner) is str and entry.owner == owner))
                and entry.settings == settings
                and entry.form == form
            ):
                return entry.data
        with deep_messages():
            data = response_echo_to_pb(r, *form).SerializeToString()
        self._echoes.insert(0, _Echo(owner, settings, form, data))
        size = 0
        for keep, entry in enumerate(self._echoes):
            size += len(entry.data)
            if keep and (keep >= _MAX_ECHOES or size > _MAX_ECHO_BYTES):
                del self._echoes[keep:]
                break
        return data

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
                response=response_to_pb(
                    e["response"], slim=self.slim, json_parameters=self.json_parameters
                ),
                sequence_number=seq,
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
                response=response_to_pb(
                    e["response"], slim=self.slim, json_parameters=self.json_parameters
                ),
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
