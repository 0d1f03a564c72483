"""Errors over HTTP: OpenAI's JSON error body, and the app's exception handlers.

Every failure, routing misses included, answers in the same shape:
``{"error": {"message", "type", "param", "code"}}`` with a 4xx (or 5xx for a real fault).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from bidi_responses.schema import JSONValue
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ExceptionHandler

from ...core.api import ApiError, server_error, shown
from ...core.observability import Metrics


def json_response(
    data: JSONValue, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """``data`` as an ``application/json`` response."""
    return Response(
        orjson.dumps(data), status_code=status, headers=headers, media_type="application/json"
    )


def error_body(error: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's HTTP error body from an error object (``{"error": {message, type, ...}}``)."""
    return {
        "error": {
            "message": error.get("message", ""),
            "type": error.get("type", "invalid_request_error"),
            "param": error.get("param"),
            "code": error.get("code"),
        }
    }


def error_response(error: ApiError, headers: Mapping[str, str] | None = None) -> Response:
    """An ApiError as its status and OpenAI's error body."""
    return json_response(error_body(error.to_error_object()), error.status, headers)


def auth_headers(error: ApiError) -> dict[str, str] | None:
    """A 401 names the scheme it wants (``WWW-Authenticate: Bearer``)."""
    return {"www-authenticate": "Bearer"} if error.status == 401 else None


def event_error_response(
    event: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Response:
    """An ``error`` event from the core as an HTTP error response (a rate limit adds
    ``retry-after``, which the openai SDKs wait for before retrying)."""
    status = event.get("status")
    error = event.get("error") or {}
    retry_after = error.get("retry_after_s")
    if retry_after:
        headers = {**(headers or {}), "retry-after": str(retry_after)}
    return json_response(
        error_body(error),
        status if isinstance(status, int) and status >= 400 else 400,
        headers,
    )


def too_large(limit: int) -> ApiError:
    """The 413 for a body or frame over the message limit."""
    return ApiError(
        f"The message is larger than the limit of {limit} bytes.",
        code="request_too_large",
        status=413,
    )


def invalid_json(detail: str) -> ApiError:
    """The 400 for a body or frame that is not JSON."""
    return ApiError(
        f"We could not parse the JSON body of your request ({detail}). The API expects a JSON "
        "object.",
        code="invalid_json",
    )


def exception_handlers(metrics: Metrics) -> dict[Any, ExceptionHandler]:
    """The app's handlers: ApiError, routing misses, and anything else as a generic 500."""

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        metrics.error("http", exc.status, exc.code)
        return error_response(exc, auth_headers(exc))

    async def http_error(request: Request, exc: Exception) -> Response:
        # Routing misses (404, 405) in the same JSON shape as every other error.
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        error = ApiError(
            f"{exc.detail}: {request.method} {shown(request.url.path)}",
            code=code,
            status=exc.status_code,
        )
        return error_response(error, exc.headers)

    async def unexpected(request: Request, exc: Exception) -> Response:
        return error_response(server_error())

    async def client_gone(request: Request, exc: Exception) -> Response:
        # The client closed its connection before its body arrived: nobody reads this answer
        # (uvicorn drops it), and it is no server fault to log with a traceback.
        error = ApiError(
            "The connection closed before the request body arrived.", code="client_disconnected"
        )
        return error_response(error)

    return {
        ApiError: api_error,
        HTTPException: http_error,
        ClientDisconnect: client_gone,
        Exception: unexpected,
    }
