"""The ApiError behind a core ``error`` event, the same on every transport (a gRPC status, an
HTTP error answer)."""

from __future__ import annotations

from collections.abc import Mapping

from bidi_responses.schema import JSONValue

from ..core.api import ApiError


def error_from_event(event: Mapping[str, JSONValue]) -> ApiError:
    """The ApiError behind a core ``error`` event."""
    body = event.get("error") or {}
    return ApiError(
        str(body.get("message") or ""),
        code=str(body.get("code") or "unknown"),
        param=body.get("param"),
        status=int(event.get("status") or 400),
        type=str(body.get("type") or "invalid_request_error"),
        metadata={
            k: str(body[k]) for k in ("limit", "limit_value", "retry_after_s") if body.get(k)
        },
    )
