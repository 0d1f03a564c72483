"""Nesting limits: decoding untrusted bytes within a bound, building deep messages from checked
data.

A ``Struct`` spends three message levels per JSON object, so a deep tool schema exceeds
protobuf's parse limit of 100 levels both when a client's message is parsed and when upb copies
a sub-message while one is built.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from .wire import LENGTH_DELIMITED, VARINT, read_varint

_M = TypeVar("_M", bound=Message)
_P = ParamSpec("_P")
_R = TypeVar("_R")

_set_allow_oversize: Callable[[bool], None] | None
try:  # upb: lifts the parse depth limit process-wide; deep_messages sets it around one use
    from google._upb._message import SetAllowOversizeProtos as _set_allow_oversize
except ImportError:  # another protobuf implementation: deep messages are refused
    _set_allow_oversize = None

#: protobuf's default nesting limit for parsing (upb, C++, Java): messages within messages.
PROTOBUF_DEFAULT_DEPTH = 100
#: The nesting decoded before the server's own checks: a Struct spends three message levels per
#: JSON object (the Struct, its map entry, the Value), so JSON nested 64 levels needs ~200. The
#: server refuses JSON deeper than 34 levels itself, naming the field; this bound only keeps
#: a hostile message from costing more than that.
API_MAX_DEPTH = 3 * 64 + 16

_deep_active = False


@contextlib.contextmanager
def deep_messages() -> Iterator[None]:
    """Lift protobuf's depth limit while building messages from checked data.

    upb copies a sub-message (``Outer(inner=msg)``, ``CopyFrom``) by serializing and parsing
    it, and that parse stops at 100 levels, so composing messages that hold deep tool schemas
    fails without this. Synchronous and re-entrant; decoding untrusted bytes never runs inside
    it (``decode_message`` applies its own bound first).
    """
    global _deep_active
    if _deep_active or _set_allow_oversize is None:
        yield
        return
    _deep_active = True
    _set_allow_oversize(True)
    try:
        yield
    finally:
        _set_allow_oversize(False)
        _deep_active = False


def deep(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` inside ``deep_messages``."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        # Nested calls (a part inside an item inside a Response) are already inside: skip
        # entering the context manager again, which would cost more than most conversions.
        if _deep_active or _set_allow_oversize is None:
            return fn(*args, **kwargs)
        with deep_messages():
            return fn(*args, **kwargs)

    return wrapper


class MessageDecodeError(ValueError):
    """A message that cannot be decoded; ``param`` names the field when it is known."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def decode_message(cls: type[_M], data: bytes, *, max_depth: int = API_MAX_DEPTH) -> _M:
    """Parse ``data`` as ``cls``, accepting nesting up to ``max_depth`` message levels.

    protobuf parses at most 100 levels, which a deep tool schema in a Struct exceeds. Only a
    message that fails the ordinary parse is walked (iteratively, in Python) to find out why:
    invalid UTF-8 in a string field or nesting beyond ``max_depth`` is reported with the field's
    path; nesting within ``max_depth`` is parsed again with the depth limit lifted.
    """
    try:
        return cls.FromString(data)
    except DecodeError:
        pass
    # upb's descriptor class implements the pure-Python one's interface.
    problem = wire_problem(data, cast(Descriptor, cls.DESCRIPTOR), max_depth)
    if problem is not None:
        raise MessageDecodeError(*problem)
    if _set_allow_oversize is not None:
        try:
            with deep_messages():
                return cls.FromString(data)
        except DecodeError:
            pass
    raise MessageDecodeError(f"The message could not be decoded as {cls.DESCRIPTOR.full_name}.")


def wire_problem(
    data: bytes, descriptor: Descriptor, max_depth: int
) -> tuple[str, str | None] | None:
    """Why ``data`` is not a valid ``descriptor`` message within ``max_depth`` levels, if it can
    tell: ``(message, field path)``; None when the structure looks valid.

    Iterative: a hostile message cannot exhaust the stack while it is checked.
    """
    # (descriptor, end offset, depth, path) of each open message; pos is shared.
    stack: list[tuple[Descriptor, int, int, str]] = [(descriptor, len(data), 1, "")]
    pos = 0
    while stack:
        desc, end, depth, path = stack[-1]
        if pos >= end:
            stack.pop()
            continue
        try:
            key, pos = read_varint(data, pos)
            number, wire_type = key >> 3, key & 7
            if wire_type == VARINT:
                _, pos = read_varint(data, pos)
            elif wire_type == 1:  # 64-bit
                pos += 8
            elif wire_type == 5:  # 32-bit
                pos += 4
            elif wire_type == LENGTH_DELIMITED:
                length, pos = read_varint(data, pos)
                start, pos = pos, pos + length
                if pos > end:
                    return "The message is truncated.", path or None
                field = desc.fields_by_number.get(number)
                if field is None:
                    continue
                where = f"{path}.{field.name}" if path else field.name
                if len(where) > 256:  # deep paths repeat themselves: keep both ends
                    where = where[:120] + "..." + where[-120:]
                if field.message_type is not None:
                    if depth + 1 > max_depth:
                        return (
                            f"Invalid '{where}': messages may nest at most {max_depth} levels.",
                            where,
                        )
                    stack.append((field.message_type, pos, depth + 1, where))
                    pos = start
                elif field.type == FieldDescriptor.TYPE_STRING:
                    try:
                        data[start:pos].decode("utf-8")
                    except UnicodeDecodeError:
                        return f"Invalid '{where}': the string is not valid UTF-8.", where
            else:
                return "The message is not valid protobuf (bad wire type).", path or None
        except IndexError:
            return "The message is truncated.", path or None
        if pos > end:
            return "The message is truncated.", path or None
    return None
