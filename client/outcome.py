"""How a turn ends: the events that end one, and the Response (or error) they carry.

A turn ends at its response's terminal event, at ``response.done`` (append mode: the response
waits for tool outputs) or at an error event.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from .types import TERMINAL_EVENTS, JSONObject, Response, ResponsesError

__all__ = ["TURN_END_CASES", "collect_response", "turn_outcome"]

#: The ``ConnectResponse`` event cases that end a turn.
TURN_END_CASES = frozenset(
    {"response_completed", "response_failed", "response_incomplete", "response_done", "error"}
)


def turn_outcome(event: JSONObject) -> Response:
    """The Response of a turn-ending event; ResponsesError for an error event."""
    kind = event["type"]
    if kind == "error":
        raise ResponsesError.from_event(event)
    if kind == "response.done":
        return Response.from_dict(event["response"], event.get("pending_calls") or [])
    return Response.from_dict(event["response"])


async def collect_response(events: AsyncGenerator[JSONObject, None]) -> Response:
    """The Response that ends ``events`` (ResponsesError for an error event)."""
    async with contextlib.aclosing(events):
        async for event in events:
            kind = event["type"]
            if kind in TERMINAL_EVENTS or kind in ("error", "response.done"):
                return turn_outcome(event)
    raise ResponsesError("stream_closed", "the stream ended before the response did")
