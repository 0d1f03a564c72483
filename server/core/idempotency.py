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

from bidi_responses.server.core.errors import ApiError

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
