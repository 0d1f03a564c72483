"""The events of a turn serialized by hand: the same bytes upb writes, a fraction of the cost.

A turn streams a few snapshots, items, parts and many deltas. Building a message for each and
serializing it costs several times what ``orjson`` spends on the same event as JSON, so these
functions write the wire format directly: fields in field-number order, proto3 defaults left
out, ``optional`` fields written whenever set, sub-messages framed by their length. That is
what upb's serializer writes, so a client reads the same bytes as before (the tests compare
them with the message path event by event). Maps (``metadata``, the stats' stage maps) and
rare shapes (annotations, other item kinds) still go through upb, framed here.

Each function takes the core's JSON-shaped event and raises (``TypeError``, ``KeyError``,
``AttributeError``, ``ValueError``) on a value it cannot write; the encoder then takes the
message path, which names the problem as it always has. One leniency: an ``int32`` field
takes any 64-bit integer here (the core's indices never come near 2**31).
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
from bidi_responses.schema import JSONMapping
from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf.message import Message

from .items import item_to_pb, part_to_pb
from .wire import LENGTH_DELIMITED, VARINT, field_number, tag

#: Each one-byte varint, by value.
ONE_BYTE = tuple(bytes((b,)) for b in range(0x80))
_UINT64 = (1 << 64) - 1


def varint(value: int) -> bytes:
    """``value`` as a varint; negative integers take ten bytes, as upb writes int32/int64."""
    if 0 <= value <= 0x7F:
        return ONE_BYTE[value]
    if 0 < value <= 0x3FFF:  # two bytes: most sequence numbers and lengths
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if not -(1 << 63) <= value < 1 << 64:
        raise ValueError(f"{value} does not fit a 64-bit field")
    value &= _UINT64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tags(message: type[Message], *names: str, kind: int = LENGTH_DELIMITED) -> list[bytes]:
    return [tag(field_number(message, name), kind) for name in names]


# Tags of the fields written here, read from the generated descriptors.
_TEXT_DELTA = _tags(pb.OutputTextDeltaEvent, "item_id", "delta")
_TEXT_DELTA_INTS = _tags(
    pb.OutputTextDeltaEvent, "output_index", "content_index", "sequence_number", kind=VARINT
)
_ARGS_DELTA = _tags(pb.FunctionCallArgumentsDeltaEvent, "item_id", "delta")
_ARGS_DELTA_INTS = _tags(
    pb.FunctionCallArgumentsDeltaEvent, "output_index", "sequence_number", kind=VARINT
)
_TEXT_DONE = _tags(pb.OutputTextDoneEvent, "item_id", "text")
_TEXT_DONE_INTS = _tags(
    pb.OutputTextDoneEvent, "output_index", "content_index", "sequence_number", kind=VARINT
)
_ARGS_DONE = _tags(pb.FunctionCallArgumentsDoneEvent, "item_id", "arguments", "name")
_ARGS_DONE_INTS = _tags(
    pb.FunctionCallArgumentsDoneEvent, "output_index", "sequence_number", kind=VARINT
)
_ITEM_EVENT_ITEM = tag(field_number(pb.OutputItemEvent, "item"), LENGTH_DELIMITED)
_ITEM_EVENT_INTS = _tags(pb.OutputItemEvent, "output_index", "sequence_number", kind=VARINT)
_PART_EVENT = _tags(pb.ContentPartEvent, "item_id", "part")
_PART_EVENT_INTS = _tags(
    pb.ContentPartEvent, "output_index", "content_index", "sequence_number", kind=VARINT
)
_ITEM_MESSAGE, _ITEM_CALL = _tags(pb.Item, "message", "function_call")
_MESSAGE = _tags(pb.MessageItem, "id", "role", "content", "status", "phase")
_CALL = _tags(pb.FunctionCallItem, "id", "call_id", "name", "arguments", "status")
_PART_OUTPUT_TEXT, _PART_INPUT_TEXT = _tags(pb.ContentPart, "output_text", "input_text")
_OUTPUT_TEXT_TEXT = tag(field_number(pb.OutputText, "text"), LENGTH_DELIMITED)
_INPUT_TEXT_TEXT = tag(field_number(pb.InputText, "text"), LENGTH_DELIMITED)
_USAGE_INTS = _tags(pb.Usage, "input_tokens", "output_tokens", "total_tokens", kind=VARINT)
_USAGE_DETAILS = _tags(pb.Usage, "input_tokens_details", "output_tokens_details")
_CACHED_TOKENS = tag(field_number(pb.InputTokensDetails, "cached_tokens"), VARINT)
_REASONING_TOKENS = tag(field_number(pb.OutputTokensDetails, "reasoning_tokens"), VARINT)
(
    _R_ID,
    _R_STATUS,
    _R_INCOMPLETE_DETAILS,
    _R_PREVIOUS_RESPONSE_ID,
    _R_OUTPUT,
    _R_ERROR,
    _R_USAGE,
    _R_SAFETY_FLAGS,
    _R_STATS,
) = _tags(
    pb.Response,
    "id",
    "status",
    "incomplete_details",
    "previous_response_id",
    "output",
    "error",
    "usage",
    "safety_flags",
    "stats",
)
_R_CREATED_AT, _R_COMPLETED_AT, _R_SLIM = _tags(
    pb.Response, "created_at", "completed_at", "slim", kind=VARINT
)
_REASON = tag(field_number(pb.IncompleteDetails, "reason"), LENGTH_DELIMITED)
_ERROR_CODE, _ERROR_MESSAGE = _tags(pb.ResponseError, "code", "message")
_TRUE = b"\x01"
_R_SLIM_TRUE = _R_SLIM + _TRUE


def _string(field_tag: bytes, value: str) -> bytes:
    """A proto3 string field: nothing when empty."""
    if not value:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        return b""
    data = value.encode()
    return field_tag + varint(len(data)) + data


def _present(field_tag: bytes, data: bytes) -> bytes:
    """A length-delimited field that is written even when empty (a set sub-message or an
    ``optional`` string)."""
    return field_tag + varint(len(data)) + data


def _int(field_tag: bytes, value: int) -> bytes:
    """A proto3 integer field: nothing when zero (``varint`` refuses what is not an int)."""
    if value:
        return field_tag + varint(value)
    if not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return b""


def text_delta(e: JSONMapping) -> bytes:
    """``OutputTextDeltaEvent``."""
    out_i, content_i, seq = _TEXT_DELTA_INTS
    return (
        _string(_TEXT_DELTA[0], e["item_id"])
        + _int(out_i, e["output_index"])
        + _int(content_i, e["content_index"])
        + _string(_TEXT_DELTA[1], e["delta"])
        + _int(seq, e.get("sequence_number", 0))
    )


def arguments_delta(e: JSONMapping) -> bytes:
    """``FunctionCallArgumentsDeltaEvent``."""
    out_i, seq = _ARGS_DELTA_INTS
    return (
        _string(_ARGS_DELTA[0], e["item_id"])
        + _int(out_i, e["output_index"])
        + _string(_ARGS_DELTA[1], e["delta"])
        + _int(seq, e.get("sequence_number", 0))
    )


def text_done(e: JSONMapping) -> bytes:
    """``OutputTextDoneEvent``."""
    out_i, content_i, seq = _TEXT_DONE_INTS
    return (
        _string(_TEXT_DONE[0], e["item_id"])
        + _int(out_i, e["output_index"])
        + _int(content_i, e["content_index"])
        + _string(_TEXT_DONE[1], e["text"])
        + _int(seq, e.get("sequence_number", 0))
    )


def arguments_done(e: JSONMapping) -> bytes:
    """``FunctionCallArgumentsDoneEvent``."""
    out_i, seq = _ARGS_DONE_INTS
    return (
        _string(_ARGS_DONE[0], e["item_id"])
        + _int(out_i, e["output_index"])
        + _string(_ARGS_DONE[1], e["arguments"])
        + _string(_ARGS_DONE[2], e["name"])
        + _int(seq, e.get("sequence_number", 0))
    )


def item_event(e: JSONMapping) -> bytes:
    """``OutputItemEvent`` (output_item.added and .done)."""
    out_i, seq = _ITEM_EVENT_INTS
    return (
        _int(out_i, e["output_index"])
        + _present(_ITEM_EVENT_ITEM, item(e["item"]))
        + _int(seq, e.get("sequence_number", 0))
    )


def part_event(e: JSONMapping) -> bytes:
    """``ContentPartEvent`` (content_part.added and .done)."""
    out_i, content_i, seq = _PART_EVENT_INTS
    return (
        _string(_PART_EVENT[0], e["item_id"])
        + _int(out_i, e["output_index"])
        + _int(content_i, e["content_index"])
        + _present(_PART_EVENT[1], part(e["part"]))
        + _int(seq, e.get("sequence_number", 0))
    )


def part(p: JSONMapping) -> bytes:
    """A ``ContentPart`` (``part_to_pb``'s bytes)."""
    kind = p.get("type")
    if kind == "output_text" and not p.get("annotations"):
        return _present(_PART_OUTPUT_TEXT, _string(_OUTPUT_TEXT_TEXT, p.get("text", "")))
    if kind == "input_text":
        return _present(_PART_INPUT_TEXT, _string(_INPUT_TEXT_TEXT, p.get("text", "")))
    return part_to_pb(p).SerializeToString()


def item(i: JSONMapping) -> bytes:
    """An ``Item`` (``item_to_pb``'s bytes)."""
    kind = i.get("type")
    if kind == "function_call":
        id_, call_id, name, arguments, status = _CALL
        return _present(
            _ITEM_CALL,
            _string(id_, i.get("id", ""))
            + _string(call_id, i["call_id"])
            + _string(name, i["name"])
            + _string(arguments, i["arguments"])
            + _string(status, i.get("status", "")),
        )
    if kind == "message":
        id_, role, content, status, phase = _MESSAGE
        return _present(
            _ITEM_MESSAGE,
            _string(id_, i.get("id", ""))
            + _string(role, i["role"])
            + b"".join([_present(content, part(p)) for p in i["content"]])
            + _string(status, i.get("status", ""))
            + _string(phase, i.get("phase") or ""),
        )
    return item_to_pb(i).SerializeToString()


def usage(u: JSONMapping) -> bytes:
    """A ``Usage`` (``usage_to_pb``'s bytes: both details always present)."""
    input_tokens, output_tokens, total_tokens = _USAGE_INTS
    input_details, output_details = _USAGE_DETAILS
    return (
        _int(input_tokens, u["input_tokens"])
        + _present(input_details, _int(_CACHED_TOKENS, u["input_tokens_details"]["cached_tokens"]))
        + _int(output_tokens, u["output_tokens"])
        + _present(
            output_details,
            _int(_REASONING_TOKENS, u["output_tokens_details"]["reasoning_tokens"]),
        )
        + _int(total_tokens, u["total_tokens"])
    )


def response_progress(
    r: JSONMapping, slim: bool, write_item: Callable[[JSONMapping], bytes] = item
) -> bytes:
    """The fields of a Response that change over its life (``response_progress_to_pb``'s
    bytes, in field-number order); ``write_item`` writes each output item."""
    get = r.get
    out = [_string(_R_ID, r["id"]), _int(_R_CREATED_AT, r["created_at"])]
    completed_at = get("completed_at")
    if completed_at is not None:
        out.append(_R_COMPLETED_AT + varint(completed_at))
    out.append(_string(_R_STATUS, r["status"]))
    details = get("incomplete_details")
    if details:
        out.append(_present(_R_INCOMPLETE_DETAILS, _string(_REASON, details["reason"])))
    previous = get("previous_response_id")
    if previous is not None:
        out.append(_present(_R_PREVIOUS_RESPONSE_ID, previous.encode()))
    for output_item in r["output"]:
        out.append(_present(_R_OUTPUT, write_item(output_item)))
    error = get("error")
    if error:
        out.append(
            _present(
                _R_ERROR,
                _string(_ERROR_CODE, error.get("code") or "")
                + _string(_ERROR_MESSAGE, error.get("message") or ""),
            )
        )
    usage_values = get("usage")
    if usage_values:
        out.append(_present(_R_USAGE, usage(usage_values)))
    flags = get("safety_flags")
    if flags:
        for flag in flags:
            out.append(_present(_R_SAFETY_FLAGS, pb.SafetyFlag(**flag).SerializeToString()))
    stats = get("stats")
    if stats:
        out.append(_present(_R_STATS, pb.ResponseStats(**stats).SerializeToString()))
    if slim:
        out.append(_R_SLIM_TRUE)
    return b"".join(out)


#: The events written here: JSON type -> the function writing its event message.
EVENT_WRITERS: dict[str, Callable[[JSONMapping], bytes]] = {
    "response.output_text.delta": text_delta,
    "response.function_call_arguments.delta": arguments_delta,
    "response.output_text.done": text_done,
    "response.function_call_arguments.done": arguments_done,
    "response.content_part.added": part_event,
    "response.content_part.done": part_event,
}


def _delta_message(
    prefix: bytes, head: bytes, delta_tag: bytes, e: JSONMapping, seq_tag: bytes
) -> bytes:
    """A delta message from its parts, joined once: ``prefix``, the event's length, the
    fields before the delta (``head``), the delta, the sequence number."""
    data = e["delta"].encode()  # only a str has encode()
    size = len(data)
    length = ONE_BYTE[size] if size < 0x80 else varint(size)
    delta_head = delta_tag + length if size else b""
    seq = e.get("sequence_number", 0)
    tail = seq_tag + varint(seq) if seq else b""
    body_size = len(head) + len(delta_head) + size + len(tail)
    return b"".join(
        (
            prefix,
            ONE_BYTE[body_size] if body_size < 0x80 else varint(body_size),
            head,
            delta_head,
            data,
            tail,
        )
    )


#: The fields of a Response that ``response_progress`` writes.
_PROGRESS_FIELDS = (
    "id",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "previous_response_id",
    "output",
    "error",
    "usage",
    "safety_flags",
    "stats",
)
# Bounds of a stream's memo of item bytes: a turn's items, each written two or three times.
_MAX_ITEMS = 16
_MAX_ITEM_BYTES = 256 << 10


class TurnWriter:
    """The event writers of one stream, with what a turn writes more than once remembered.

    An item is written when it is added, when it is done and again in the terminal
    snapshot; ``response.created`` and ``response.in_progress`` carry the same progress. A
    value is recognised by its JSON (``orjson``, a fraction of the cost of writing it here),
    which is immutable: an item changed in place is never mistaken for its earlier state.
    Owned by the stream's encoder, bounded by count and bytes.
    """

    def __init__(self) -> None:
        # The fields a delta shares with the previous delta of its kind (same item).
        self._text_key: tuple[object, ...] = ()
        self._text_head = b""
        self._args_key: tuple[object, ...] = ()
        self._args_head = b""
        self._items: dict[bytes, bytes] = {}
        self._item_bytes = 0
        self._progress_key = b""
        self._progress = b""

    def text_delta_message(self, prefix: bytes, e: JSONMapping) -> bytes:
        """A whole text delta message: ``prefix`` (the ``stream_id`` field and the event's
        key), the event's length, then ``text_delta``'s bytes, the fields before the delta
        reused from the previous delta and everything joined once (the hot path)."""
        key = (e["item_id"], e["output_index"], e["content_index"])
        if key != self._text_key:
            out_i, content_i, _ = _TEXT_DELTA_INTS
            self._text_head = (
                _string(_TEXT_DELTA[0], key[0]) + _int(out_i, key[1]) + _int(content_i, key[2])
            )
            self._text_key = key
        return _delta_message(prefix, self._text_head, _TEXT_DELTA[1], e, _TEXT_DELTA_INTS[2])

    def arguments_delta_message(self, prefix: bytes, e: JSONMapping) -> bytes:
        """``text_delta_message`` for an arguments delta."""
        key = (e["item_id"], e["output_index"])
        if key != self._args_key:
            self._args_head = _string(_ARGS_DELTA[0], key[0]) + _int(_ARGS_DELTA_INTS[0], key[1])
            self._args_key = key
        return _delta_message(prefix, self._args_head, _ARGS_DELTA[1], e, _ARGS_DELTA_INTS[1])

    def item(self, i: JSONMapping) -> bytes:
        """``item``, remembered."""
        key = orjson.dumps(i)
        data = self._items.get(key)
        if data is None:
            data = item(i)
            if len(self._items) >= _MAX_ITEMS or self._item_bytes > _MAX_ITEM_BYTES:
                self._items.clear()
                self._item_bytes = 0
            self._items[key] = data
            self._item_bytes += len(key) + len(data)
        return data

    def item_event(self, e: JSONMapping) -> bytes:
        """``item_event``, its item remembered."""
        out_i, seq = _ITEM_EVENT_INTS
        return (
            _int(out_i, e["output_index"])
            + _present(_ITEM_EVENT_ITEM, self.item(e["item"]))
            + _int(seq, e.get("sequence_number", 0))
        )

    def response_progress(self, r: JSONMapping, slim: bool) -> bytes:
        """``response_progress``; before any output (``response.created`` and
        ``response.in_progress``), the last one again when its fields are the same."""
        if r["output"]:
            return response_progress(r, slim, self.item)
        key = orjson.dumps([slim, *[r.get(name) for name in _PROGRESS_FIELDS]])
        if key != self._progress_key:
            self._progress = response_progress(r, slim, self.item)
            self._progress_key = key
        return self._progress
