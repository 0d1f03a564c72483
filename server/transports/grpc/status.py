"""gRPC status conventions: an ApiError as a status code with ``google.rpc.Status`` details.

The code follows what happened (NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE, ...), so mesh
error-rate metrics and retry policies see it. Details (``grpcio-status``) carry an
``ErrorInfo`` (reason = the error code, metadata = param, type, HTTP status and any named
limit) and, when a field is at fault, a ``BadRequest`` naming it. The plain ``error-code`` and
``error-param`` trailers stay for clients that do not decode details.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.transports.grpc.context import Context
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "bidi-responses"

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
    "server_shutting_down": grpc.StatusCode.UNAVAILABLE,
    "connection_age_limit_reached": grpc.StatusCode.UNAVAILABLE,
    "websocket_connection_limit_reached": grpc.StatusCode.UNAVAILABLE,
}


def grpc_code(error: ApiError) -> grpc.StatusCode:
    """The status code that says what happened."""
    return _BY_CODE.get(error.code) or _BY_HTTP_STATUS.get(error.status, grpc.StatusCode.UNKNOWN)


def to_status(error: ApiError) -> grpc.Status:
    """A ``grpc.Status`` with rich details and the plain error trailers."""
    code = grpc_code(error)
    info = error_details_pb2.ErrorInfo(
        reason=error.code,
        domain=DOMAIN,
        metadata={
            "type": error.type,
            "http_status": str(error.status),
            **({"param": error.param} if error.param else {}),
            **error.metadata,
        },
    )
    detail = status_pb2.Status(code=code.value[0], message=error.message)
    detail.details.add().Pack(info)
    if error.param:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=error.param, description=error.message, reason=error.code
                )
            ]
        )
        detail.details.add().Pack(bad)
    status = rpc_status.to_status(detail)
    trailers = (
        *status.trailing_metadata,
        ("error-code", error.code),
        ("error-param", error.param or ""),
    )
    return _Status(status.code, status.details, trailers)


class _Status(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: Any) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata


async def abort(context: Context, error: ApiError) -> NoReturn:
    """End the call with ``error``'s status (raises, like ``context.abort``)."""
    status = to_status(error)
    await context.abort(status.code, status.details, status.trailing_metadata)
