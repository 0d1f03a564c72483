"""Every event a stream carries to its client (``ServerEvent``), narrowed by
``event["type"]``: a response's events, steering's, and the stream's own (an error, a warning).

The server's core builds each event once as one of these JSON shapes; WebSocket and SSE write
it as JSON and gRPC maps it by field name, so nothing here knows a wire.
"""

from __future__ import annotations

from typing import Literal, TypeAlias, TypedDict

from .answers import ErrorObject
from .response_events import (
    ContentPartAddedEvent,
    ContentPartDoneEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    OutputItemAddedEvent,
    OutputItemDoneEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    ResponseDoneEvent,
    SnapshotEvent,
)
from .response_object import ResponseObject
from .steering_events import SteerEvent

# -- stream-level events ---------------------------------------------------------------------


class ErrorEvent(TypedDict):
    """WebSocket mode's nested error (also used on Connect); the turn ends with it."""

    type: Literal["error"]
    status: int
    error: ErrorObject


class WarningEvent(TypedDict):
    """Advance notice about the stream (its age limit, the server draining)."""

    type: Literal["warning"]
    code: str
    message: str


#: Every event of one response, as the core emits it.
ResponseEvent: TypeAlias = (
    SnapshotEvent
    | ResponseDoneEvent
    | OutputItemAddedEvent
    | OutputItemDoneEvent
    | ContentPartAddedEvent
    | ContentPartDoneEvent
    | OutputTextDeltaEvent
    | OutputTextDoneEvent
    | FunctionCallArgumentsDeltaEvent
    | FunctionCallArgumentsDoneEvent
    | ErrorEvent
)
#: Everything a stream can carry to its client.
ServerEvent: TypeAlias = ResponseEvent | SteerEvent | WarningEvent


def terminal_response(event: ServerEvent) -> ResponseObject | None:
    """The Response a terminal event carries (None for the other events)."""
    if (
        event["type"] == "response.completed"
        or event["type"] == "response.failed"
        or event["type"] == "response.incomplete"
    ):
        return event["response"]
    return None


def snapshot_of(event: ServerEvent) -> ResponseObject | None:
    """The Response a lifecycle event carries (None for the other events)."""
    if (
        event["type"] == "response.created"
        or event["type"] == "response.queued"
        or event["type"] == "response.in_progress"
        or event["type"] == "response.completed"
        or event["type"] == "response.failed"
        or event["type"] == "response.incomplete"
        or event["type"] == "response.done"
    ):
        return event["response"]
    return None
