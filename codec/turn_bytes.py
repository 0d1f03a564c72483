"""The events of a turn serialized by hand: the same bytes upb writes, a fraction of the cost.

A turn streams a few snapshots, items, parts and many deltas. Building a message for each and
serializing it costs several times what ``orjson`` spends on the same event as JSON, so these
functions write the wire format directly: fields in field-number order, proto3 defaults left
out, ``optional`` fields written whenever set, sub-messages framed by their length
(``proto3_fields``). That is what upb's serializer writes, so a client reads the same bytes
as before (the tests compare them with the message path event by event). Rare shapes
(annotations, other item kinds, a stats value of an unusual type) still go through upb,
framed here.

What a turn writes more than once is written once (``TurnWriter``): the leading fields of an
item's events (its id and indices, the same in every delta), an item (added, done, then in
the terminal snapshot: ``item_bytes``), a snapshot's fixed fields and stats
(``response_bytes``). Each event is written whole: its tags precomputed, its parts joined
once, no message built.

Each writer takes the core's JSON-shaped event and raises (``TypeError``, ``KeyError``,
``AttributeError``, ``ValueError``) on a value it cannot write or a field it misses (an event
without its sequence number included); the encoder then takes the message path, which writes
it or names the problem as it always has. One leniency: an ``int32`` field
takes any 64-bit integer here (the core's indices never come near 2**31).
"""

from __future__ import annotations

from typing import Any

from bidi_responses.schema import JSONMapping
from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf.message import Message

from .item_bytes import ItemMemo, part
from .proto3_fields import int_field, message_tag, present_field, string_field
from .response_bytes import ResponseWriter
from .wire import ONE_BYTE, VARINT, varint

__all__ = ["TurnWriter"]


def _head_tags(message: type[Message], *ints: str) -> tuple[bytes, ...]:
    """The tags of an event's leading fields: ``item_id`` and its indices."""
    return (message_tag(message, "item_id"), *(message_tag(message, name, VARINT) for name in ints))


# Tags of the fields written here, read from the generated descriptors.
# An item's events lead with its id and indices, by the same field numbers in each (checked
# below), so one head serves a text's deltas, its done event and its parts, another the
# arguments' deltas and done event.
_TEXT_DELTA_HEAD = _head_tags(pb.OutputTextDeltaEvent, "output_index", "content_index")
_TEXT_DELTA = message_tag(pb.OutputTextDeltaEvent, "delta")
_TEXT_DELTA_SEQ = message_tag(pb.OutputTextDeltaEvent, "sequence_number", VARINT)
_ARGS_DELTA_HEAD = _head_tags(pb.FunctionCallArgumentsDeltaEvent, "output_index")
_ARGS_DELTA = message_tag(pb.FunctionCallArgumentsDeltaEvent, "delta")
_ARGS_DELTA_SEQ = message_tag(pb.FunctionCallArgumentsDeltaEvent, "sequence_number", VARINT)
_TEXT_DONE_HEAD = _head_tags(pb.OutputTextDoneEvent, "output_index", "content_index")
_TEXT_DONE = message_tag(pb.OutputTextDoneEvent, "text")
_TEXT_DONE_SEQ = message_tag(pb.OutputTextDoneEvent, "sequence_number", VARINT)
_ARGS_DONE_HEAD = _head_tags(pb.FunctionCallArgumentsDoneEvent, "output_index")
_ARGS_DONE = (
    message_tag(pb.FunctionCallArgumentsDoneEvent, "arguments"),
    message_tag(pb.FunctionCallArgumentsDoneEvent, "name"),
)
_ARGS_DONE_SEQ = message_tag(pb.FunctionCallArgumentsDoneEvent, "sequence_number", VARINT)
_PART_EVENT_HEAD = _head_tags(pb.ContentPartEvent, "output_index", "content_index")
if not _TEXT_DELTA_HEAD == _TEXT_DONE_HEAD == _PART_EVENT_HEAD:
    raise RuntimeError("a text's events no longer share their leading fields")
if _ARGS_DELTA_HEAD != _ARGS_DONE_HEAD:
    raise RuntimeError("the arguments' events no longer share their leading fields")
_PART_EVENT_PART = message_tag(pb.ContentPartEvent, "part")
_PART_EVENT_SEQ = message_tag(pb.ContentPartEvent, "sequence_number", VARINT)
_ITEM_EVENT_INDEX = message_tag(pb.OutputItemEvent, "output_index", VARINT)
_ITEM_EVENT_ITEM = message_tag(pb.OutputItemEvent, "item")
_ITEM_EVENT_SEQ = message_tag(pb.OutputItemEvent, "sequence_number", VARINT)


#: The part of content_part.added for a text, and its ``part`` field.
_EMPTY_TEXT = {"type": "output_text", "text": "", "annotations": []}
_EMPTY_TEXT_FIELD = present_field(_PART_EVENT_PART, part(_EMPTY_TEXT))


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


class TurnWriter:
    """The event writers of one stream, with what a turn writes more than once remembered.

    Each ``*_event`` method writes a whole ``ConnectResponse``: ``lead`` is its
    ``stream_id`` field and the event's key, the rest comes from the event.

    An item is written when it is added, when it is done and again in the terminal
    snapshot (``ItemMemo``, shared with the snapshots' ``ResponseWriter``);
    ``response.created`` and ``response.in_progress`` carry the same progress. An item's
    head is kept while its id and indices (compared as they are) stay the same. Owned by the
    stream's encoder.
    """

    def __init__(self) -> None:
        # The last text's and the last call's id and indices, and their events' head: the
        # same for each of their deltas (the head with the delta's tag), done event, parts.
        self._text_key: tuple[Any, ...] = ()
        self._text_head = self._text_delta_head = b""
        self._args_key: tuple[Any, ...] = ()
        self._args_head = self._args_delta_head = b""
        self._items = ItemMemo()
        self._responses = ResponseWriter(self._items)

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
        item_value = self._items.framed(e["item"])
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

    def response_progress(self, r: JSONMapping, slim: bool) -> bytes:
        """The fields of a Response that change over its life (``ResponseWriter.progress``),
        its items shared with the item events."""
        return self._responses.progress(r, slim)
