"""Framing the core's events: SSE frames for HTTP, JSON text frames for WebSocket mode."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from bidi_responses.schema import JSONObject, JSONValue

from ...core.runs import OutEvent

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def sse_frame(data: Mapping[str, Any]) -> bytes:
    """One SSE event: ``event:`` line, one ``data:`` line, blank line; ``\\n`` endings only.

    orjson never emits a raw newline (it escapes them inside strings), so the JSON always fits
    on the single ``data:`` line strict parsers require.
    """
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def flat_sse_error(event: Mapping[str, JSONValue], sequence_number: int) -> JSONObject:
    """The core's nested error event in the flat shape SSE clients parse.

    The SDK raises mid-stream on any SSE data with a top-level ``error`` object, so SSE uses
    ``ResponseErrorEvent``: ``{"type": "error", "code", "message", "param", ...}``.
    """
    error = event.get("error") or {}
    return {
        "type": "error",
        "code": error.get("code"),
        "message": error.get("message", ""),
        "param": error.get("param"),
        "sequence_number": sequence_number,
    }


def _ws_event(out: OutEvent) -> Mapping[str, JSONValue]:
    return out.data if not out.lane else {**out.data, "stream_id": out.lane}


def ws_frame(out: OutEvent) -> bytes:
    """One WebSocket text frame's UTF-8 payload for a session event; named lanes echo their
    ``stream_id``."""
    # Sent as text, never binary: a binary frame is fatal to some clients (Codex).
    return orjson.dumps(_ws_event(out))


def ws_batch_frame(ready: list[OutEvent]) -> bytes:
    """Non-standard: the events ready together as one text frame holding a JSON array.

    Only for connections that asked with ``?batch_frames=1`` (a benchmark reference: what
    batching would give WebSocket mode if its wire allowed it; no hosted-API client parses it).
    """
    if len(ready) == 1:
        return ws_frame(ready[0])
    return orjson.dumps([_ws_event(out) for out in ready])
