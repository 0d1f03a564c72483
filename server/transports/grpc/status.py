"""gRPC status conventions: an ApiError as a status code with ``google.rpc.Status`` details.

The code follows what happened (NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE, ...), so mesh
error-rate metrics and retry policies see it. Details (``grpcio-status``) carry an
``ErrorInfo`` (reason = the error code, metadata = param, type, HTTP status and any named
limit) and, when a field is at fault, a ``BadRequest`` naming it. The plain ``error-code`` and
``error-param`` trailers stay for clients that do not decode details.
"""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

import grpc
from google.rpc import error_details_pb2, status_pb2

# What grpc.aio raises when a batch on a call that the client already closed fails.
from grpc._cython.cygrpc import ExecuteBatchError
from grpc_status import rpc_status

from ...core.api import ApiError
from .context import Context

DOMAIN = "bidi-responses"

# What a status may carry. Its message and details travel in trailing metadata, which clients
# cap (grpcio: 8 KiB, a soft limit past which calls fail at random), so both are bounded in
# bytes; a plain trailer must be printable ASCII or the status cannot be sent at all.
_MESSAGE_BYTES = 512
_PARAM_BYTES = 256
_DESCRIPTION_BYTES = 256
_TRAILER_CHARS = 256

_BY_HTTP_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

# Codes whose HTTP status says less than gRPC can.
_BY_CODE = {
    "previous_response_not_found": grpc.StatusCode.NOT_FOUND,
    "response_not_found": grpc.StatusCode.NOT_FOUND,
    "not_found": grpc.StatusCode.NOT_FOUND,
    # CancelResponse names an in-flight response: a finished one fails its precondition.
    "response_not_cancellable": grpc.StatusCode.FAILED_PRECONDITION,
    "server_shutting_down": grpc.StatusCode.UNAVAILABLE,
    "connection_age_limit_reached": grpc.StatusCode.UNAVAILABLE,
    "websocket_connection_limit_reached": grpc.StatusCode.UNAVAILABLE,
}


def grpc_code(error: ApiError) -> grpc.StatusCode:
    """The status code that says what happened."""
    return _BY_CODE.get(error.code) or _BY_HTTP_STATUS.get(error.status, grpc.StatusCode.UNKNOWN)


def to_status(error: ApiError) -> grpc.Status:
    """A ``grpc.Status`` with rich details and the plain error trailers, always sendable:
    the message and details bounded in bytes, the plain trailers printable ASCII."""
    code = grpc_code(error)
    message = fit_bytes(error.message, _MESSAGE_BYTES)
    param = fit_bytes(error.param, _PARAM_BYTES) if error.param else ""
    info = error_details_pb2.ErrorInfo(
        reason=ascii_trailer(error.code),
        domain=DOMAIN,
        metadata={
            "type": error.type,
            "http_status": str(error.status),
            **({"param": param} if param else {}),
            **error.metadata,
        },
    )
    detail = status_pb2.Status(code=code.value[0], message=message)
    detail.details.add().Pack(info)
    if param:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=param,
                    description=fit_bytes(message, _DESCRIPTION_BYTES),
                    reason=ascii_trailer(error.code),
                )
            ]
        )
        detail.details.add().Pack(bad)
    status = rpc_status.to_status(detail)
    trailers = (
        *status.trailing_metadata,
        ("error-code", ascii_trailer(error.code)),
        ("error-param", ascii_trailer(error.param or "")),
    )
    return _Status(status.code, status.details, trailers)


def fit_bytes(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (on a character boundary)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "..."


def ascii_trailer(value: str) -> str:
    """``value`` as a plain (non ``-bin``) metadata value: printable ASCII, anything else
    escaped as Python writes it (``\\n``, ``\\u202e``), at most ``_TRAILER_CHARS``."""
    if value.isascii() and value.isprintable() and len(value) <= _TRAILER_CHARS:
        return value
    escaped = value.encode("unicode_escape").decode("ascii")
    escaped = "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in escaped)
    if len(escaped) <= _TRAILER_CHARS:
        return escaped
    half = (_TRAILER_CHARS - 3) // 2
    return f"{escaped[:half]}...{escaped[-half:]}"


class _Status(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: Any) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata


async def abort(context: Context, error: ApiError) -> NoReturn:
    """End the call with ``error``'s status (raises, like ``context.abort``).

    A client that cancels while the status is being sent (a drain racing the client's own
    cancel) makes grpc.aio's send fail. The call was cancelled, so it ends as one: quietly,
    where the failure would otherwise be logged as an ERROR and a second abort attempted.
    """
    if context.done():
        raise asyncio.CancelledError  # a status was already sent, or the call is gone
    status = to_status(error)
    try:
        await context.abort(status.code, status.details, status.trailing_metadata)
    except ExecuteBatchError as gone:
        raise asyncio.CancelledError from gone
