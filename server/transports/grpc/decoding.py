"""Requests arrive as raw bytes and are decoded here, so an undecodable one gets a status (or
an ``error`` event) this server chooses instead of grpc.aio's silence."""

from __future__ import annotations

import logging
from typing import TypeVar

from bidi_responses.codec import MessageDecodeError, decode_message
from bidi_responses.server.core.api.errors import ApiError
from google.protobuf.message import Message

log = logging.getLogger("bidi_responses.grpc")

_M = TypeVar("_M", bound=Message)


def undecodable(error: MessageDecodeError, method: str) -> ApiError:
    """The 400 for a message that cannot be decoded, logged once as a WARNING."""
    log.warning("%s: undecodable request refused: %s", method, error.message)
    return ApiError(error.message, code="invalid_message", param=error.param)


def decode_request(request_class: type[_M], raw: bytes, method: str) -> _M:
    """``raw`` as ``request_class``; the 400 ApiError (logged) if it cannot be decoded."""
    try:
        return decode_message(request_class, raw)
    except MessageDecodeError as problem:
        raise undecodable(problem, method) from None
