"""Requests arrive as raw bytes and are decoded here, so an undecodable one gets a status (or
an ``error`` event) this server chooses instead of grpc.aio's silence."""

from __future__ import annotations

import logging
from typing import TypeVar

from bidi_responses.codec import MessageDecodeError, decode_message
from bidi_responses.codec.wire import read_varint
from google.protobuf.message import Message

from ...core.api import ApiError
from ...core.observability import CLIENT_FAULTS

log = logging.getLogger("bidi_responses.grpc")

_M = TypeVar("_M", bound=Message)


def undecodable(error: MessageDecodeError, method: str) -> ApiError:
    """The 400 for a message that cannot be decoded, logged as a WARNING within the
    client-fault rate (a client decides how many it sends)."""
    CLIENT_FAULTS.log(
        log,
        logging.WARNING,
        "grpc-undecodable",
        "%s: undecodable request refused: %s",
        method,
        error.message,
    )
    return ApiError(error.message, code="invalid_message", param=error.param)


def decode_request(request_class: type[_M], raw: bytes, method: str) -> _M:
    """``raw`` as ``request_class``; the 400 ApiError (logged) if it cannot be decoded."""
    try:
        return decode_message(request_class, raw)
    except MessageDecodeError as problem:
        raise undecodable(problem, method) from None


# ConnectRequest's top-level fields an error about a message names (responses.proto).
_STREAM_ID, _EVENT_ID = 1, 80
_EVENT_FIELDS = {2: "response.create", 3: "response.append", 4: "response.cancel"}


def peek_connect_request(raw: bytes) -> tuple[str, dict[str, object]]:
    """The lane (``stream_id``) of a ``ConnectRequest`` and what an error about it answers
    (``request_type``, ``event_id``), read from its top-level fields without decoding it: for
    a message refused before it is decoded, so the error reaches the lane that waits for it."""
    lane = ""
    answers: dict[str, object] = {}
    pos = 0
    try:
        while pos < len(raw):
            key, pos = read_varint(raw, pos)
            number, wire_type = key >> 3, key & 7
            if wire_type == 2:
                length, pos = read_varint(raw, pos)
                end = pos + length
                if number == _STREAM_ID:
                    lane = raw[pos:end].decode()
                elif number == _EVENT_ID:
                    answers["event_id"] = raw[pos:end].decode()
                elif number in _EVENT_FIELDS:
                    answers["request_type"] = _EVENT_FIELDS[number]
                pos = end
            elif wire_type == 0:
                _, pos = read_varint(raw, pos)
            elif wire_type in (1, 5):
                pos += 8 if wire_type == 1 else 4
            else:
                break
    except (IndexError, UnicodeDecodeError):
        pass  # what was read so far is the best guess; the message is refused either way
    return lane, answers
