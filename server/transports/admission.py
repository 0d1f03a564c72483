"""Admitting a request, the same on every transport: who is calling (the tenant and quota key
behind its ``Authorization`` value), and the refusal of a server that is draining.

Only where the header is found differs (HTTP headers, gRPC metadata).
"""

from __future__ import annotations

from ..core.api import ApiError
from ..core.tenancy import ApiKeys, Caller

__all__ = ["Caller", "identify", "shutting_down"]


def identify(keys: ApiKeys, authorization: str | None, peer: str | None = None) -> Caller:
    """The caller of a request, passed to the core as is (the body is never rewritten with
    it); ApiError 401 when keys are on and the key is missing or wrong.

    The key itself is never logged or echoed.
    """
    tenant = keys.authenticate(authorization)
    return Caller(tenant, None if tenant is not None else keys.label(authorization), peer)


def shutting_down(what: str) -> ApiError:
    """The 503 for new ``what`` (streams, requests) once a drain has begun."""
    return ApiError(
        f"The server is shutting down and takes no new {what}; retry on another replica.",
        code="server_shutting_down",
        status=503,
        type="server_error",
    )
