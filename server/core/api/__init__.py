"""The server's side of the API: the checked parsing of a request and its items into the shared
types (``bidi_responses.schema``), client events, tools, errors and ids. Nothing here does I/O or
keeps state between requests."""

from .client_events import (
    AppendEvent,
    CancelEvent,
    ClientEvent,
    CreateEvent,
    EventRefused,
    answering,
    lane_named,
    parse_json_event,
)
from .errors import ApiError, not_found, server_error, shown
from .jsonshape import check_json_shape

__all__ = [
    "ApiError",
    "AppendEvent",
    "CancelEvent",
    "ClientEvent",
    "CreateEvent",
    "EventRefused",
    "answering",
    "check_json_shape",
    "lane_named",
    "not_found",
    "parse_json_event",
    "server_error",
    "shown",
]
