"""A Response's progress written by hand (``response_progress_to_pb``'s bytes): the fields of a
snapshot that change over a response's life, its request echo being serialized elsewhere.

A turn sends several snapshots of one response (``response.created``,
``response.in_progress``, the terminal one): what they share is written once per stream
(``ResponseWriter``): the fixed fields (``id``, ``created_at``, ``previous_response_id``), a
known status, the stats (the same until the output), the items (``ItemMemo``). A usage and an
error are written field by field; the stats and the safety flags go through upb.
"""

from __future__ import annotations

from typing import Any

import orjson
from bidi_responses.schema import JSONMapping
from bidi_responses.v1 import responses_pb2 as pb

from .item_bytes import ItemMemo
from .proto3_fields import count_field, message_tag, present_field, string_field
from .wire import ONE_BYTE, VARINT, exact, varint

__all__ = ["ResponseWriter", "usage"]

_R_ID = message_tag(pb.Response, "id")
_R_CREATED_AT = message_tag(pb.Response, "created_at", VARINT)
_R_COMPLETED_AT = message_tag(pb.Response, "completed_at", VARINT)
_R_STATUS = message_tag(pb.Response, "status")
_R_INCOMPLETE_DETAILS = message_tag(pb.Response, "incomplete_details")
_R_PREVIOUS_RESPONSE_ID = message_tag(pb.Response, "previous_response_id")
_R_OUTPUT = message_tag(pb.Response, "output")
_R_ERROR = message_tag(pb.Response, "error")
_R_USAGE = message_tag(pb.Response, "usage")
_R_SAFETY_FLAGS = message_tag(pb.Response, "safety_flags")
_R_STATS = message_tag(pb.Response, "stats")
_R_SLIM_TRUE = message_tag(pb.Response, "slim", VARINT) + b"\x01"
_USAGE_INPUT = message_tag(pb.Usage, "input_tokens", VARINT)
_USAGE_INPUT_DETAILS = message_tag(pb.Usage, "input_tokens_details")
_USAGE_OUTPUT = message_tag(pb.Usage, "output_tokens", VARINT)
_USAGE_OUTPUT_DETAILS = message_tag(pb.Usage, "output_tokens_details")
_USAGE_TOTAL = message_tag(pb.Usage, "total_tokens", VARINT)
_CACHED_TOKENS = message_tag(pb.InputTokensDetails, "cached_tokens", VARINT)
_REASONING_TOKENS = message_tag(pb.OutputTokensDetails, "reasoning_tokens", VARINT)
_REASON = message_tag(pb.IncompleteDetails, "reason")
# The statuses of a response, as ``status`` fields (another is written as it comes).
_STATUS_FIELDS = {
    status: _R_STATUS + bytes((len(status),)) + status.encode()
    for status in ("queued", "in_progress", "completed", "failed", "incomplete", "cancelled")
}
_ERROR_CODE = message_tag(pb.ResponseError, "code")
_ERROR_MESSAGE = message_tag(pb.ResponseError, "message")


def usage(u: JSONMapping) -> bytes:
    """A ``Usage`` (``usage_to_pb``'s bytes: both details always present, each at most 11
    bytes)."""
    cached = count_field(_CACHED_TOKENS, u["input_tokens_details"]["cached_tokens"])
    reasoning = count_field(_REASONING_TOKENS, u["output_tokens_details"]["reasoning_tokens"])
    return b"".join(
        (
            count_field(_USAGE_INPUT, u["input_tokens"]),
            _USAGE_INPUT_DETAILS,
            ONE_BYTE[len(cached)],
            cached,
            count_field(_USAGE_OUTPUT, u["output_tokens"]),
            _USAGE_OUTPUT_DETAILS,
            ONE_BYTE[len(reasoning)],
            reasoning,
            count_field(_USAGE_TOTAL, u["total_tokens"]),
        )
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


# Bounds of a stream's memo of stats bytes: a response's snapshots before its output share one.
_MAX_STATS = 4


class ResponseWriter:
    """The progress of one stream's responses, with what their snapshots repeat remembered:
    the last response's fixed fields, a few stats, the items (``items``, shared with the
    stream's item events). Owned by the stream's ``TurnWriter``."""

    def __init__(self, items: ItemMemo) -> None:
        self._items = items
        # The last response's fixed fields (id, created_at, previous_response_id) and their
        # bytes: those before its status and the one after.
        self._response_key: tuple[Any, ...] = ()
        self._response_prefix = b""
        self._response_suffix = b""
        self._stats: dict[bytes, bytes] = {}

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

    def progress(self, r: JSONMapping, slim: bool) -> bytes:
        """The fields of a Response that change over its life (``response_progress_to_pb``'s
        bytes, in field-number order): those fixed for a response (``id``, ``created_at``,
        ``previous_response_id``) written once, a known status written once, the items and
        stats remembered."""
        get = r.get
        key = (r["id"], r["created_at"], get("previous_response_id"))
        if key != self._response_key:
            self._response_prefix = string_field(_R_ID, key[0]) + count_field(_R_CREATED_AT, key[1])
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
        framed_item = self._items.framed
        for output_item in r["output"]:
            out += (_R_OUTPUT, framed_item(output_item))
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
