"""Errors that reach clients: one type, rendered by each transport in its own framing.

Over HTTP an ApiError becomes a status code and OpenAI's JSON error body; on a WebSocket or
Connect stream it becomes an ``error`` event and the stream stays open; on a unary gRPC call
it becomes a status code with the message.
"""

from __future__ import annotations

from typing import cast

from bidi_responses.server.core.api.schema import ErrorObject


class ApiError(Exception):
    """A request-level error with OpenAI's error shape.

    ``param`` is the offending field as a JSON path (``input[3].call_id``) so a client can
    tell exactly what to fix.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid_value",
        param: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        # Extra machine-readable facts (a limit's name): gRPC ErrorInfo metadata.
        self.metadata = metadata or {}
        self.message = message
        self.code = code
        self.param = param
        self.status = status
        self.type = type

    def to_error_object(self) -> ErrorObject:
        """The ``error`` object of OpenAI's error body."""
        body: ErrorObject = {
            "type": self.type,
            "code": self.code,
            "message": self.message,
            "param": self.param,
        }
        # ``metadata`` holds the limit facts, which ``ErrorObject`` names.
        return cast(ErrorObject, {**body, **self.metadata}) if self.metadata else body

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, {self.message!r}, param={self.param!r})"


def invalid(param: str, reason: str, *, code: str = "invalid_value") -> ApiError:
    """A 400 for one field: the message names the field and the reason."""
    return ApiError(f"Invalid '{param}': {reason}", code=code, param=param)


def missing(param: str) -> ApiError:
    """A 400 for a required field that is absent or empty."""
    return ApiError(
        f"Missing required parameter: '{param}'.", code="missing_required_parameter", param=param
    )


def previous_response_not_found(response_id: str) -> ApiError:
    """The id is neither in this stream's cache nor in the durable store."""
    return ApiError(
        f"Previous response with id '{response_id}' not found.",
        code="previous_response_not_found",
        param="previous_response_id",
        status=400,
    )


def not_found(what: str, ident: str) -> ApiError:
    """A 404 for a stored object."""
    return ApiError(f"No {what} found with id '{ident}'.", code="not_found", status=404)


def server_error() -> ApiError:
    """A 500 for a real server fault; never carries exception text to the client."""
    return ApiError(
        "The server had an error processing your request.",
        code="server_error",
        status=500,
        type="server_error",
    )
