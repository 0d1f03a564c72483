"""The words a stream ends with: the warning before its age limit and the error at it, and the
warning and the error of a server that drains. The transport names the age limit's codes
(``naming.StreamNaming.age_limit_prefix``); ``session.Session`` sends them."""

from __future__ import annotations

from bidi_responses.schema import WarningEvent

from ...config import Limits
from ..api.errors import ApiError


def age_limit_warning(limits: Limits, prefix: str) -> WarningEvent:
    """``connection_warning_s`` before the age limit: open a new connection."""
    return {
        "type": "warning",
        "code": f"{prefix}_approaching",
        "message": f"This connection will be closed in "
        f"{limits.connection_warning_s:g} s (limit {limits.connection_max_age_s:g} s). "
        "Open a new one to continue.",
    }


def age_limit_reached(limits: Limits, prefix: str) -> ApiError:
    return ApiError(
        f"The connection reached its limit of {limits.connection_max_age_s:g} s; "
        "open a new connection to continue.",
        code=f"{prefix}_reached",
    )


def draining_warning(grace_s: float) -> WarningEvent:
    """Finish the turn in flight here, send the next one on a new stream (through the proxy,
    to another replica)."""
    return {
        "type": "warning",
        "code": "server_draining",
        "message": "This server is shutting down: responses in flight finish within "
        f"{grace_s:g} s, then the stream ends. Send new turns on a new connection.",
    }


def shutting_down() -> ApiError:
    """How a draining server's stream ends: UNAVAILABLE (gRPC) / 1012 (WebSocket), never OK."""
    return ApiError(
        "The server is shutting down; open a new stream to continue.",
        code="server_shutting_down",
        status=503,
        type="server_error",
    )
