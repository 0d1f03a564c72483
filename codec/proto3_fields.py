"""Proto3 fields written by hand, as upb writes them: what the hand-written event writers share.

A default value (an empty string, a zero) is left out, an ``optional`` or a set sub-message is
written whenever present, a field's tag is read from the generated descriptor. Each writer
raises ``TypeError`` on a value of the wrong type, so its caller can fall back to the message
path, which names the problem.
"""

from __future__ import annotations

from google.protobuf.message import Message

from .wire import LENGTH_DELIMITED, ONE_BYTE, field_number, tag, varint

__all__ = ["count_field", "int_field", "message_tag", "present_field", "string_field"]


def message_tag(message: type[Message], name: str, kind: int = LENGTH_DELIMITED) -> bytes:
    """The tag of ``message``'s field ``name``, of wire type ``kind``."""
    # ``tag`` is cached: the same field key is the same bytes object wherever it is used.
    return tag(field_number(message, name), kind)


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


def count_field(field_tag: bytes, value: int) -> bytes:
    """An int64 count field: nothing when zero; TypeError for anything but an int (a bool
    included, as upb refuses it)."""
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    if 0 < value < 0x80:
        return field_tag + ONE_BYTE[value]
    return field_tag + varint(value) if value else b""
