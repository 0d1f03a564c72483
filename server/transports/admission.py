"""Admitting a request, the same on every transport: who is calling (the tenant and quota key
behind its ``Authorization`` value), and the refusal of a server that is draining.

Only where the header is found differs (HTTP headers, gRPC metadata).
"""

from __future__ import annotations

from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.core.api.items import JSONObject
from bidi_responses.server.core.tenancy.auth import ApiKeys

# (tenant, quota key): the tenant is None on an open server; the quota key is whom limits count
# against (the tenant, or on an open server the token's label).
Caller = tuple[str | None, str | None]


def identify(keys: ApiKeys, authorization: str | None) -> Caller:
    """The caller of a request; ApiError 401 when keys are on and the key is missing or wrong.

    The key itself is never logged or echoed.
    """
    tenant = keys.authenticate(authorization)
    return tenant, tenant or keys.label(authorization)


def quota_key(caller: Caller, peer: str) -> str:
    """Whom a stream's limits count against: the tenant, or on an open server the bearer
    token's label; a caller with neither (an open server, no token) counts as its connection
    (the transport's peer address), so one client's idle streams cannot fill a bucket that
    every anonymous client shares."""
    tenant, quota = caller
    return quota or tenant or f"peer {peer}"


def label_open_caller(body: JSONObject, caller: Caller) -> None:
    """On an open server, the token's label stands in for a tenant in the ledger (``user``)."""
    tenant, quota = caller
    if tenant is None and quota is not None and body.get("user") is None:
        body["user"] = quota


def shutting_down(what: str) -> ApiError:
    """The 503 for new ``what`` (streams, requests) once a drain has begun."""
    return ApiError(
        f"The server is shutting down and takes no new {what}; retry on another replica.",
        code="server_shutting_down",
        status=503,
        type="server_error",
    )
