"""Who is calling: what the transport learned from a request's credentials, passed to the core
as a typed argument (the request body is never rewritten with it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    """The caller of a stream or request.

    ``tenant`` is the authenticated tenant (None on an open server); ``label`` the token's
    label on an open server (None without a token, or when keys are on); ``peer`` the network
    peer as the transport names it, for logs.
    """

    tenant: str | None = None
    label: str | None = None
    peer: str | None = None

    @property
    def quota_key(self) -> str:
        """Whom limits count against: the tenant, else the token's label; a caller with
        neither (an open server, no token) counts as its connection (the peer), so one
        client's idle streams cannot fill a bucket that every anonymous client shares."""
        if self.tenant or self.label:
            return self.tenant or self.label or ""
        return f"peer {self.peer}" if self.peer else "anonymous"

    def account(self, user: str | None) -> str:
        """Whom the usage ledger charges: the tenant; on an open server the body's ``user``,
        else the token's label."""
        return self.tenant or user or self.label or "anonymous"

    def idempotency_scope(self, user: str | None) -> str | None:
        """What scopes an idempotency key (the body's ``user`` only on an open server)."""
        return self.tenant or user or self.label


#: A caller without credentials on an open server.
ANONYMOUS = Caller()
