"""An item and its content parts written by hand (``item_to_pb``'s and ``part_to_pb``'s
bytes), and a stream's memo of the items it has written.

A turn writes each item two or three times (when it is added, when it is done, in the
terminal snapshot), so a stream remembers an item's bytes by its JSON. The common kinds (a
message of text parts, a function call) are written field by field; the rare shapes
(annotations, other item kinds) go through upb.
"""

from __future__ import annotations

import orjson
from bidi_responses.schema import JSONMapping
from bidi_responses.v1 import responses_pb2 as pb

from .items import item_to_pb, part_to_pb
from .proto3_fields import message_tag, present_field, string_field
from .wire import exact, varint

__all__ = ["ItemMemo", "item", "part"]

_ITEM_MESSAGE = message_tag(pb.Item, "message")
_ITEM_CALL = message_tag(pb.Item, "function_call")
_MESSAGE = tuple(
    message_tag(pb.MessageItem, n) for n in ("id", "role", "content", "status", "phase")
)
_CALL = tuple(
    message_tag(pb.FunctionCallItem, n) for n in ("id", "call_id", "name", "arguments", "status")
)
_PART_OUTPUT_TEXT = message_tag(pb.ContentPart, "output_text")
_PART_INPUT_TEXT = message_tag(pb.ContentPart, "input_text")
_OUTPUT_TEXT_TEXT = message_tag(pb.OutputText, "text")
_INPUT_TEXT_TEXT = message_tag(pb.InputText, "text")


def part(p: JSONMapping) -> bytes:
    """A ``ContentPart`` (``part_to_pb``'s bytes)."""
    kind = p.get("type")
    if kind == "output_text" and not p.get("annotations"):
        return present_field(_PART_OUTPUT_TEXT, string_field(_OUTPUT_TEXT_TEXT, p.get("text", "")))
    if kind == "input_text":
        return present_field(_PART_INPUT_TEXT, string_field(_INPUT_TEXT_TEXT, p.get("text", "")))
    return part_to_pb(p).SerializeToString()


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


# Bounds of a stream's memo of item bytes: a turn's items, each written two or three times.
_MAX_ITEMS = 16
_MAX_ITEM_BYTES = 256 << 10


class ItemMemo:
    """The items one stream has written, by their JSON (``orjson``, a fraction of the cost
    of writing an item here), which is immutable: an item changed in place is never mistaken
    for its earlier state. Bounded by count and bytes."""

    def __init__(self) -> None:
        self._items: dict[bytes, bytes] = {}
        self._item_bytes = 0

    def framed(self, i: JSONMapping) -> bytes:
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
