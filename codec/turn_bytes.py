"""The events of a turn serialized by hand: the same bytes upb writes, a fraction of the cost.

A turn streams a few snapshots, items, parts and many deltas. Building a message for each and
serializing it costs several times what ``orjson`` spends on the same event as JSON, so these
functions write the wire format directly: fields in field-number order, proto3 defaults left
out, ``optional`` fields written whenever set, sub-messages framed by their length. That is
what upb's serializer writes, so a client reads the same bytes as before (the tests compare
them with the message path event by event). Rare shapes (annotations, other item kinds, a
stats value of an unusual type) still go through upb, framed here.

What a turn writes more than once is written once (``TurnWriter``): the leading fields of an
item's events (its id and indices, the same in every delta), an item (added, done, then in
the terminal snapshot), a response's fixed fields (``id``, ``created_at``,
``previous_response_id``) and a known status, its stats (the same in ``response.created`` and
``response.in_progress``). Each event is written whole: its tags precomputed, its parts
joined once, no message built.

Each writer takes the core's JSON-shaped event and raises (``TypeError``, ``KeyError``,
``AttributeError``, ``ValueError``) on a value it cannot write or a field it misses (an event
without its sequence number included); the encoder then takes the message path, which writes
it or names the problem as it always has. One leniency: an ``int32`` field
takes any 64-bit integer here (the core's indices never come near 2**31).
"""

from __future__ import annotations

from typing import Any

import orjson
from bidi_responses.schema import JSONMapping
from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf.message import Message

from .items import item_to_pb, part_to_pb
from .wire import LENGTH_DELIMITED, ONE_BYTE, VARINT, exact, field_number, tag, varint

__all__ = ["ONE_BYTE", "TurnWriter", "item", "part", "varint"]


def string_field(field_tag: bytes, value: str) -> bytes:
    """A proto3 string field: nothing when empty."""
    if not value:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        return b""
    data = value.encode()
    size = len(data)
    return b"".join((field_tag, ONE_BYTE[size] if size < 0x80 else varint(size), data))


def present_field(field_tag: bytes, data: bytes) -> bytes:
    """A length-delimited field that is written even when empty (a set sub-message or an
    ``optional`` string)."""
    size = len(data)
    return b"".join((field_tag, ONE_BYTE[size] if size < 0x80 else varint(size), data))


def int_field(field_tag: bytes, value: int) -> bytes:
    """A proto3 integer field: nothing when zero (``varint`` refuses what is not an int)."""
    if value:
        return field_tag + varint(value)
    if not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return b""


def _tag(message: type[Message], name: str, kind: int = LENGTH_DELIMITED) -> bytes:
    # ``tag`` is cached: the same field key is the same bytes object wherever it is used.
    return tag(field_number(message, name), kind)


def _head_tags(message: type[Message], *ints: str) -> tuple[bytes, ...]:
    """The tags of an event's leading fields: ``item_id`` and its indices."""
    return (_tag(message, "item_id"), *(_tag(message, name, VARINT) for name in ints))


# Tags of the fields written here, read from the generated descriptors.
# An item's events lead with its id and indices, by the same field numbers in each (checked
# below), so one head serves a text's deltas, its done event and its parts, another the
# arguments' deltas and done event.
_TEXT_DELTA_HEAD = _head_tags(pb.OutputTextDeltaEvent, "output_index", "content_index")
_TEXT_DELTA = _tag(pb.OutputTextDeltaEvent, "delta")
_TEXT_DELTA_SEQ = _tag(pb.OutputTextDeltaEvent, "sequence_number", VARINT)
_ARGS_DELTA_HEAD = _head_tags(pb.FunctionCallArgumentsDeltaEvent, "output_index")
_ARGS_DELTA = _tag(pb.FunctionCallArgumentsDeltaEvent, "delta")
_ARGS_DELTA_SEQ = _tag(pb.FunctionCallArgumentsDeltaEvent, "sequence_number", VARINT)
_TEXT_DONE_HEAD = _head_tags(pb.OutputTextDoneEvent, "output_index", "content_index")
_TEXT_DONE = _tag(pb.OutputTextDoneEvent, "text")
_TEXT_DONE_SEQ = _tag(pb.OutputTextDoneEvent, "sequence_number", VARINT)
_ARGS_DONE_HEAD = _head_tags(pb.FunctionCallArgumentsDoneEvent, "output_index")
_ARGS_DONE = (
    _tag(pb.FunctionCallArgumentsDoneEvent, "arguments"),
    _tag(pb.FunctionCallArgumentsDoneEvent, "name"),
)
_ARGS_DONE_SEQ = _tag(pb.FunctionCallArgumentsDoneEvent, "sequence_number", VARINT)
_PART_EVENT_HEAD = _head_tags(pb.ContentPartEvent, "output_index", "content_index")
if not _TEXT_DELTA_HEAD == _TEXT_DONE_HEAD == _PART_EVENT_HEAD:
    raise RuntimeError("a text's events no longer share their leading fields")
if _ARGS_DELTA_HEAD != _ARGS_DONE_HEAD:
    raise RuntimeError("the arguments' events no longer share their leading fields")
_PART_EVENT_PART = _tag(pb.ContentPartEvent, "part")
_PART_EVENT_SEQ = _tag(pb.ContentPartEvent, "sequence_number", VARINT)
_ITEM_EVENT_INDEX = _tag(pb.OutputItemEvent, "output_index", VARINT)
_ITEM_EVENT_ITEM = _tag(pb.OutputItemEvent, "item")
_ITEM_EVENT_SEQ = _tag(pb.OutputItemEvent, "sequence_number", VARINT)
_ITEM_MESSAGE = _tag(pb.Item, "message")
_ITEM_CALL = _tag(pb.Item, "function_call")
_MESSAGE = tuple(_tag(pb.MessageItem, n) for n in ("id", "role", "content", "status", "phase"))
_CALL = tuple(
    _tag(pb.FunctionCallItem, n) for n in ("id", "call_id", "name", "arguments", "status")
)
_PART_OUTPUT_TEXT = _tag(pb.ContentPart, "output_text")
_PART_INPUT_TEXT = _tag(pb.ContentPart, "input_text")
_OUTPUT_TEXT_TEXT = _tag(pb.OutputText, "text")
_INPUT_TEXT_TEXT = _tag(pb.InputText, "text")
_R_ID = _tag(pb.Response, "id")
_R_CREATED_AT = _tag(pb.Response, "created_at", VARINT)
_R_COMPLETED_AT = _tag(pb.Response, "completed_at", VARINT)
_R_STATUS = _tag(pb.Response, "status")
_R_INCOMPLETE_DETAILS = _tag(pb.Response, "incomplete_details")
_R_PREVIOUS_RESPONSE_ID = _tag(pb.Response, "previous_response_id")
_R_OUTPUT = _tag(pb.Response, "output")
_R_ERROR = _tag(pb.Response, "error")
_R_USAGE = _tag(pb.Response, "usage")
_R_SAFETY_FLAGS = _tag(pb.Response, "safety_flags")
_R_STATS = _tag(pb.Response, "stats")
_R_SLIM_TRUE = _tag(pb.Response, "slim", VARINT) + b"\x01"
_USAGE_INPUT = _tag(pb.Usage, "input_tokens", VARINT)
_USAGE_INPUT_DETAILS = _tag(pb.Usage, "input_tokens_details")
_USAGE_OUTPUT = _tag(pb.Usage, "output_tokens", VARINT)
_USAGE_OUTPUT_DETAILS = _tag(pb.Usage, "output_tokens_details")
_USAGE_TOTAL = _tag(pb.Usage, "total_tokens", VARINT)
_CACHED_TOKENS = _tag(pb.InputTokensDetails, "cached_tokens", VARINT)
_REASONING_TOKENS = _tag(pb.OutputTokensDetails, "reasoning_tokens", VARINT)
_REASON = _tag(pb.IncompleteDetails, "reason")
# The statuses of a response, as ``status`` fields (another is written as it comes).
_STATUS_FIELDS = {
    status: _R_STATUS + bytes((len(status),)) + status.encode()
    for status in ("queued", "in_progress", "completed", "failed", "incomplete", "cancelled")
}
_ERROR_CODE = _tag(pb.ResponseError, "code")
_ERROR_MESSAGE = _tag(pb.ResponseError, "message")


def part(p: JSONMapping) -> bytes:
    """A ``ContentPart`` (``part_to_pb``'s bytes)."""
    kind = p.get("type")
    if kind == "output_text" and not p.get("annotations"):
        return present_field(_PART_OUTPUT_TEXT, string_field(_OUTPUT_TEXT_TEXT, p.get("text", "")))
    if kind == "input_text":
        return present_field(_PART_INPUT_TEXT, string_field(_INPUT_TEXT_TEXT, p.get("text", "")))
    return part_to_pb(p).SerializeToString()


#: The part of content_part.added for a text, and its ``part`` field.
_EMPTY_TEXT = {"type": "output_text", "text": "", "annotations": []}
_EMPTY_TEXT_FIELD = present_field(_PART_EVENT_PART, part(_EMPTY_TEXT))


def item(i: JSONMapping) -> bytes:
    """An ``Item`` (``item_to_pb``'s bytes)."""
    kind = i.get("type")
    if kind == "function_call":
        get = i.get
        id_, call_id, name, arguments, status = _CALL
        call = b"".join(
            (
                string_field(id_, get("id", "")),
                string_field(call_id, i["call_id"]),
                string_field(name, i["name"]),
                string_field(arguments, i["arguments"]),
                string_field(status, get("status", "")),
            )
        )
        return present_field(_ITEM_CALL, call)
    if kind == "message":
        get = i.get
        id_, role, content, status, phase = _MESSAGE
        message = b"".join(
            (
                string_field(id_, get("id", "")),
                string_field(role, i["role"]),
                *[present_field(content, part(p)) for p in i["content"]],
                string_field(status, get("status", "")),
                string_field(phase, get("phase") or ""),
            )
        )
        return present_field(_ITEM_MESSAGE, message)
    return item_to_pb(i).SerializeToString()


def _count(field_tag: bytes, value: int) -> bytes:
    """An int64 count field: nothing when zero; TypeError for anything but an int (a bool
    included, as upb refuses it)."""
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    if 0 < value < 0x80:
        return field_tag + ONE_BYTE[value]
    return field_tag + varint(value) if value else b""


def usage(u: JSONMapping) -> bytes:
    """A ``Usage`` (``usage_to_pb``'s bytes: both details always present, each at most 11
    bytes)."""
    cached = _count(_CACHED_TOKENS, u["input_tokens_details"]["cached_tokens"])
    reasoning = _count(_REASONING_TOKENS, u["output_tokens_details"]["reasoning_tokens"])
    return b"".join(
        (
            _count(_USAGE_INPUT, u["input_tokens"]),
            _USAGE_INPUT_DETAILS,
            ONE_BYTE[len(cached)],
            cached,
            _count(_USAGE_OUTPUT, u["output_tokens"]),
            _USAGE_OUTPUT_DETAILS,
            ONE_BYTE[len(reasoning)],
            reasoning,
            _count(_USAGE_TOTAL, u["total_tokens"]),
        )
    )


def _head(tags: tuple[bytes, ...], key: tuple[Any, ...]) -> bytes:
    """An item's events' leading fields: ``item_id`` and its indices (``key``)."""
    out = [string_field(tags[0], key[0])]
    for index_tag, index in zip(tags[1:], key[1:], strict=True):
        if 0 < index < 0x80:  # (a float fails here too: ONE_BYTE takes an int only)
            out += (index_tag, ONE_BYTE[index])
        else:
            out.append(int_field(index_tag, index))
    return b"".join(out)


def _event(lead: bytes, head: bytes, fields: bytes, seq_tag: bytes, seq: int) -> bytes:
    """A whole event message, joined once: ``lead`` (the ``stream_id`` field and the event's
    key), the event's length, its leading fields, the others, its sequence number."""
    tail = seq_tag + (ONE_BYTE[seq] if 0 < seq < 0x80 else varint(seq)) if seq else b""
    size = len(head) + len(fields) + len(tail)
    return b"".join((lead, ONE_BYTE[size] if size < 0x80 else varint(size), head, fields, tail))


def _text_event(
    lead: bytes, head: bytes, text_tag: bytes, text: str, seq_tag: bytes, seq: int
) -> bytes:
    """``_event`` of one string field after the head (a delta, a done text), its parts
    joined once without building the field first: the deltas' hot path."""
    data = text.encode()  # only a str has encode()
    size = len(data)
    if size:
        string_head = text_tag + (ONE_BYTE[size] if size < 0x80 else varint(size))
        size += len(string_head)
    else:
        string_head = b""
    if seq:
        tail = seq_tag + (ONE_BYTE[seq] if 0 < seq < 0x80 else varint(seq))
        size += len(tail)
    else:
        tail = b""
    size += len(head)
    return b"".join(
        (lead, ONE_BYTE[size] if size < 0x80 else varint(size), head, string_head, data, tail)
    )


def _delta_event(lead: bytes, head: bytes, data: bytes, seq_tag: bytes, seq: int) -> bytes:
    """A delta event whose ``head`` ends with the delta's tag, with a delta and a sequence
    number both present: the deltas' hot path, joined once."""
    size = len(data)
    length = ONE_BYTE[size] if size < 0x80 else varint(size)
    number = ONE_BYTE[seq] if 0 < seq < 0x80 else varint(seq)
    size += len(head) + len(length) + len(seq_tag) + len(number)
    return b"".join(
        (lead, ONE_BYTE[size] if size < 0x80 else varint(size), head, length, data, seq_tag, number)
    )


def _stats(values: JSONMapping) -> bytes:
    """A ``ResponseStats`` (``stats_to_pb``'s bytes). Built by upb: a message of a dozen
    scalars is built faster by its keyword arguments than written field by field here, and
    upb writes the maps in its own order (which differs between processes)."""
    return pb.ResponseStats(**values).SerializeToString()


def _error(error: JSONMapping) -> bytes:
    """A ``ResponseError``: its code and message (null ones empty)."""
    return string_field(_ERROR_CODE, error.get("code") or "") + string_field(
        _ERROR_MESSAGE, error.get("message") or ""
    )


# Bounds of a stream's memo of item bytes: a turn's items, each written two or three times.
_MAX_ITEMS = 16
_MAX_ITEM_BYTES = 256 << 10
# Bounds of a stream's memo of stats bytes: a response's snapshots before its output share one.
_MAX_STATS = 4


class TurnWriter:
    """The event writers of one stream, with what a turn writes more than once remembered.

    Each ``*_event`` method writes a whole ``ConnectResponse``: ``lead`` is its
    ``stream_id`` field and the event's key, the rest comes from the event.

    An item is written when it is added, when it is done and again in the terminal
    snapshot; ``response.created`` and ``response.in_progress`` carry the same progress. A
    dict is recognised by its JSON (``orjson``, a fraction of the cost of writing it here),
    which is immutable: an item changed in place is never mistaken for its earlier state.
    Scalars (ids, indices, statuses) are compared as they are. Owned by the stream's
    encoder, bounded by count and bytes.
    """

    def __init__(self) -> None:
        # The last text's and the last call's id and indices, and their events' head: the
        # same for each of their deltas (the head with the delta's tag), done event, parts.
        self._text_key: tuple[Any, ...] = ()
        self._text_head = self._text_delta_head = b""
        self._args_key: tuple[Any, ...] = ()
        self._args_head = self._args_delta_head = b""
        self._items: dict[bytes, bytes] = {}
        self._item_bytes = 0
        # The last response's fixed fields (id, created_at, previous_response_id) and their
        # bytes: those before its status and the one after.
        self._response_key: tuple[Any, ...] = ()
        self._response_prefix = b""
        self._response_suffix = b""
        self._stats: dict[bytes, bytes] = {}

    def _text_head_of(self, key: tuple[Any, ...]) -> bytes:
        """The head of a text's events (``item_id``, ``output_index``, ``content_index``),
        written when ``key`` is not the last text's."""
        if key != self._text_key:
            self._text_head = _head(_TEXT_DELTA_HEAD, key)
            self._text_delta_head = self._text_head + _TEXT_DELTA
            self._text_key = key
        return self._text_head

    def _args_head_of(self, key: tuple[Any, ...]) -> bytes:
        """The head of the arguments' events (``item_id``, ``output_index``), written when
        ``key`` is not the last call's."""
        if key != self._args_key:
            self._args_head = _head(_ARGS_DELTA_HEAD, key)
            self._args_delta_head = self._args_head + _ARGS_DELTA
            self._args_key = key
        return self._args_head

    # The deltas are most of a turn's events, so each is written inline: its item's head
    # and the delta's tag kept per kind of delta, the parts joined once (a call costs about
    # what writing a field does). An empty delta or a sequence number of 0 takes
    # ``_text_event``, which leaves out what proto3 leaves out.

    def text_delta_event(self, lead: bytes, e: JSONMapping) -> bytes:
        """``OutputTextDeltaEvent``: the item's head, the delta, the sequence number."""
        key = (e["item_id"], e["output_index"], e["content_index"])
        if key != self._text_key:
            self._text_head_of(key)
        head = self._text_delta_head
        data = e["delta"].encode()  # only a str has encode()
        seq = e["sequence_number"]
        if not (data and seq):
            head = head[: -len(_TEXT_DELTA)]
            return _text_event(lead, head, _TEXT_DELTA, e["delta"], _TEXT_DELTA_SEQ, seq)
        return _delta_event(lead, head, data, _TEXT_DELTA_SEQ, seq)

    def arguments_delta_event(self, lead: bytes, e: JSONMapping) -> bytes:
        """``FunctionCallArgumentsDeltaEvent``: as ``text_delta_event``, without a content
        index."""
        key = (e["item_id"], e["output_index"])
        if key != self._args_key:
            self._args_head_of(key)
        head = self._args_delta_head
        data = e["delta"].encode()
        seq = e["sequence_number"]
        if not (data and seq):
            head = head[: -len(_ARGS_DELTA)]
            return _text_event(lead, head, _ARGS_DELTA, e["delta"], _ARGS_DELTA_SEQ, seq)
        return _delta_event(lead, head, data, _ARGS_DELTA_SEQ, seq)

    def text_done_event(self, lead: bytes, e: JSONMapping) -> bytes:
        """``OutputTextDoneEvent``."""
        head = self._text_head_of((e["item_id"], e["output_index"], e["content_index"]))
        seq = e["sequence_number"]
        return _text_event(lead, head, _TEXT_DONE, e["text"], _TEXT_DONE_SEQ, seq)

    def arguments_done_event(self, lead: bytes, e: JSONMapping) -> bytes:
        """``FunctionCallArgumentsDoneEvent``."""
        head = self._args_head_of((e["item_id"], e["output_index"]))
        arguments, name = _ARGS_DONE
        fields = string_field(arguments, e["arguments"]) + string_field(name, e["name"])
        return _event(lead, head, fields, _ARGS_DONE_SEQ, e["sequence_number"])

    def part_event(self, lead: bytes, e: JSONMapping) -> bytes:
        """``ContentPartEvent`` (content_part.added and .done)."""
        head = self._text_head_of((e["item_id"], e["output_index"], e["content_index"]))
        p = e["part"]
        # The part a text starts with, the same every time: compared, not written.
        fields = _EMPTY_TEXT_FIELD if p == _EMPTY_TEXT else present_field(_PART_EVENT_PART, part(p))
        return _event(lead, head, fields, _PART_EVENT_SEQ, e["sequence_number"])

    def item_event(self, lead: bytes, e: JSONMapping) -> bytes:
        """``OutputItemEvent`` (output_item.added and .done), its item remembered."""
        index = e["output_index"]
        if 0 < index < 0x80:
            head = _ITEM_EVENT_INDEX + ONE_BYTE[index]
        else:
            head = int_field(_ITEM_EVENT_INDEX, index)
        item_value = self.framed_item(e["item"])
        seq = e["sequence_number"]
        tail = _ITEM_EVENT_SEQ + (ONE_BYTE[seq] if 0 < seq < 0x80 else varint(seq)) if seq else b""
        size = len(head) + len(_ITEM_EVENT_ITEM) + len(item_value) + len(tail)
        return b"".join(
            (
                lead,
                ONE_BYTE[size] if size < 0x80 else varint(size),
                head,
                _ITEM_EVENT_ITEM,
                item_value,
                tail,
            )
        )

    def framed_item(self, i: JSONMapping) -> bytes:
        """``item``'s bytes after their length (a field's value but its tag), remembered."""
        key = orjson.dumps(i)
        data = self._items.get(key)
        if data is None:
            written = item(i)
            data = varint(len(written)) + written
            if len(self._items) >= _MAX_ITEMS or self._item_bytes > _MAX_ITEM_BYTES:
                self._items.clear()
                self._item_bytes = 0
            self._items[exact(key)] = data
            self._item_bytes += len(key) + len(data)
        return data

    def stats_field(self, values: JSONMapping) -> bytes:
        """The ``stats`` field of a Response, remembered: a response's snapshots before its
        output carry the same counters (and the turns of a steady agent loop often do)."""
        try:
            key = orjson.dumps(values)
        except TypeError:  # not JSON: serialized as it is, not remembered
            return present_field(_R_STATS, _stats(values))
        data = self._stats.get(key)
        if data is None:
            data = present_field(_R_STATS, _stats(values))
            if len(self._stats) >= _MAX_STATS:
                self._stats.clear()
            self._stats[exact(key)] = data
        return data

    def response_progress(self, r: JSONMapping, slim: bool) -> bytes:
        """The fields of a Response that change over its life (``response_progress_to_pb``'s
        bytes, in field-number order): those fixed for a response (``id``, ``created_at``,
        ``previous_response_id``) written once, a known status written once, the items and
        stats remembered."""
        get = r.get
        key = (r["id"], r["created_at"], get("previous_response_id"))
        if key != self._response_key:
            self._response_prefix = string_field(_R_ID, key[0]) + _count(_R_CREATED_AT, key[1])
            previous = key[2]
            self._response_suffix = (
                b""
                if previous is None
                else present_field(_R_PREVIOUS_RESPONSE_ID, previous.encode())
            )
            self._response_key = key
        out = [self._response_prefix]
        completed_at = get("completed_at")
        if completed_at is not None:
            out += (_R_COMPLETED_AT, varint(completed_at))
        status = r["status"]
        out.append(_STATUS_FIELDS.get(status) or string_field(_R_STATUS, status))
        details = get("incomplete_details")
        if details:
            reason = string_field(_REASON, details["reason"])
            out.append(present_field(_R_INCOMPLETE_DETAILS, reason))
        out.append(self._response_suffix)
        for output_item in r["output"]:
            out += (_R_OUTPUT, self.framed_item(output_item))
        error = get("error")
        if error:
            out.append(present_field(_R_ERROR, _error(error)))
        usage_values = get("usage")
        if usage_values:
            out.append(present_field(_R_USAGE, usage(usage_values)))
        for flag in get("safety_flags") or ():
            out.append(present_field(_R_SAFETY_FLAGS, pb.SafetyFlag(**flag).SerializeToString()))
        stats_values = get("stats")
        if stats_values:
            out.append(self.stats_field(stats_values))
        if slim:
            out.append(_R_SLIM_TRUE)
        return b"".join(out)
