"""Idempotent turns: a client-supplied key names the response a turn creates.

A client whose stream broke after it sent a turn cannot tell whether the turn ran: the
terminal event may have been lost with the replica. It sends the turn again, on a new stream
(possibly another replica), with the same ``idempotency_key``. The key fixes the response id,
so the second attempt finds the first one's stored response and replays its terminal event
instead of running (and billing) the turn again; two attempts racing on two replicas write the
same id, and the store keeps one response and one ledger row per id.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Container

from ..api.errors import ApiError, shown
from ..api.requests import CreateRequest
from ..tenancy.caller import Caller
from .backend import ResponseStore
from .store import StoredResponse

_KEY = re.compile(r"[\x21-\x7e]{1,255}")


def check_key(key: str) -> str:
    """The key, or ApiError naming ``idempotency_key`` (1-255 printable ASCII characters)."""
    if not _KEY.fullmatch(key):
        raise ApiError(
            "Invalid 'idempotency_key': expected 1 to 255 printable ASCII characters "
            "without spaces.",
            code="invalid_idempotency_key",
            param="idempotency_key",
        )
    return key


def idempotent_response_id(tenant: str | None, key: str) -> str:
    """The response id a key names, scoped to the tenant (keys of two tenants never meet)."""
    digest = hashlib.sha256(f"{tenant or ''}\x00{key}".encode()).hexdigest()
    return f"resp_{digest[:32]}"


async def find_replay(
    store: ResponseStore, running: Container[str], request: CreateRequest, caller: Caller
) -> tuple[str, StoredResponse | None]:
    """The response id the request's key names, and that response if it already exists in
    ``store``; ApiError while it is still ``running`` (the server's in-flight response ids) or
    when the key was used for another turn."""
    assert request.idempotency_key is not None
    # Keyed by the authenticated tenant (the body's user or the token's label only on an open
    # server), so one tenant's key never names another tenant's response.
    scope = caller.idempotency_scope(request.user)
    response_id = idempotent_response_id(scope, check_key(request.idempotency_key))
    if response_id in running:
        raise ApiError(
            f"A response with this 'idempotency_key' ('{response_id}') is still in progress; "
            "wait for its terminal event.",
            code="idempotent_request_in_progress",
            param="idempotency_key",
            status=409,
        )
    stored = await store.get(response_id, caller.tenant)
    if stored is not None and (
        stored.response.get("previous_response_id") != request.previous_response_id
    ):
        raise ApiError(
            f"'idempotency_key' was already used for response '{response_id}', which continues "
            f"'{shown(str(stored.response.get('previous_response_id')))}', not "
            f"'{shown(str(request.previous_response_id))}'.",
            code="idempotency_key_reused",
            param="idempotency_key",
            status=409,
        )
    return response_id, stored
