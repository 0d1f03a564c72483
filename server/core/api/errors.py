"""Errors that reach clients: one type, rendered by each transport in its own framing.

Over HTTP an ApiError becomes a status code and OpenAI's JSON error body; on a WebSocket or
Connect stream it becomes an ``error`` event and the stream stays open; on a unary gRPC call
it becomes a status code with the message.
"""

from __future__ import annotations

from typing import cast

from bidi_responses.schema import ErrorObject

#: Client text an error message quotes (an id, a name, a value) is cut to this many characters.
ECHO_CHARS = 100
#: No error message is longer than this, whatever it quotes: it travels in gRPC status
#: metadata, log lines and error bodies.
MESSAGE_CHARS = 1000
#: A field path (``param``) is cut to this many characters, keeping both ends.
PARAM_CHARS = 256


def shown(text: str, limit: int = ECHO_CHARS) -> str:
    """Client text as an error message quotes it: control and invisible characters escaped
    (a newline reads ``\\n``), cut to ``limit`` characters with the full length said."""
    escaped = "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )
    if len(escaped) <= limit:
        return escaped
    return f"{escaped[:limit]}... ({len(text)} characters)"


def clip_path(path: str, limit: int = PARAM_CHARS) -> str:
    """A field path short enough to echo; a long one keeps both ends (deep paths repeat)."""
    if len(path) <= limit:
        return path
    half = (limit - 3) // 2
    return f"{path[:half]}...{path[-half:]}"


def shown_path(path: str) -> str:
    """A field path as a message quotes it: clipped, control characters escaped."""
    return shown(clip_path(path), 2 * PARAM_CHARS)


def _bounded(message: str) -> str:
    if len(message) <= MESSAGE_CHARS:
        return message
    return f"{message[: MESSAGE_CHARS - 40]}... (message cut, {len(message)} characters)"


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
        message = _bounded(message)
        param = clip_path(param) if param is not None else None
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
    return ApiError(f"Invalid '{shown_path(param)}': {reason}", code=code, param=param)


def missing(param: str) -> ApiError:
    """A 400 for a required field that is absent or empty."""
    return ApiError(
        f"Missing required parameter: '{shown_path(param)}'.",
        code="missing_required_parameter",
        param=param,
    )


def previous_response_not_found(response_id: str) -> ApiError:
    """The id is neither in this stream's cache nor in the durable store."""
    return ApiError(
        f"Previous response with id '{shown(response_id)}' not found.",
        code="previous_response_not_found",
        param="previous_response_id",
        status=400,
    )


def not_found(what: str, ident: str) -> ApiError:
    """A 404 for a stored object."""
    return ApiError(f"No {what} found with id '{shown(ident)}'.", code="not_found", status=404)


def not_waiting(response_id: str) -> ApiError:
    """A 409 for tool outputs sent to a response that is not waiting for them."""
    return ApiError(
        f"Response '{response_id}' is not waiting for tool outputs.",
        code="response_not_waiting",
        param="response_id",
        status=409,
    )


def server_error() -> ApiError:
    """A 500 for a real server fault; never carries exception text to the client."""
    return ApiError(
        "The server had an error processing your request.",
        code="server_error",
        status=500,
        type="server_error",
    )
