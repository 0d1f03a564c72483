"""Who a request is accounted to: a stable tenant name from the caller's credentials."""

from __future__ import annotations

import hashlib


def tenant_from_authorization(value: str | None) -> str | None:
    """A stable tenant name for a bearer token (a short hash; the token itself is not kept)."""
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return "key_" + hashlib.sha256(token.encode()).hexdigest()[:16]
