"""Connections as a bounded resource: how many each listener may hold, and the account of
the HTTP/WebSocket listener's connections by client address.

Every connection is a descriptor. Without a bound, one client opening connections fills the
process's descriptor table (RLIMIT_NOFILE), and then every other client, on every transport,
times out while ``accept()`` fails. So: start-up raises the soft descriptor limit to the hard
one; what is left after ``limits.reserved_descriptors`` (store, journal, engines, logs) is
split between the two listeners; and on the HTTP listener no client address may hold more
than ``limits.max_connections_per_peer`` of it (never more than half), so a flood from one
address leaves room for everyone else. gRPC's share is bounded by grpc core's connection
quota (``grpc.max_allowed_incoming_connections``), which closes a connection past it at
``accept()``; grpc core does not say who a connection is from before it accepts it, so there
is no per-address bound there (see docs/mesh.md).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Literal

from ..config import Limits
from ..core.api import ApiError

#: Below this many descriptors for connections, the reserve shrinks to half the limit.
_MIN_FOR_CONNECTIONS = 64


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one where allowed; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass  # a sandbox that forbids it: the limits below follow the soft limit
    return soft


@dataclass(frozen=True, slots=True)
class ConnectionCaps:
    """The connection limits in force (0 = none)."""

    descriptors: int
    http: int
    grpc: int
    per_peer: int


def connection_caps(limits: Limits) -> ConnectionCaps:
    """The limits in force under the process's current descriptor limit: configured values,
    with 0 for the listeners meaning an even split of what the reserve leaves."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    reserve = limits.reserved_descriptors
    if soft - reserve < _MIN_FOR_CONNECTIONS:
        reserve = soft // 2
    share = max((soft - reserve) // 2, 1)
    http = limits.max_connections or share
    grpc = limits.max_grpc_connections or share
    per_peer = limits.max_connections_per_peer
    if per_peer:
        per_peer = min(per_peer, max(http // 2, 1))
    return ConnectionCaps(int(soft), http, grpc, per_peer)


def too_many_connections(*, per_peer: bool, limit: int) -> ApiError:
    """The refusal of a connection past a limit: 429 for the client's own address (it holds
    too many), 503 when the server as a whole is full."""
    if per_peer:
        return ApiError(
            f"Too many connections from your address: at most {limit} at once "
            "(limits.max_connections_per_peer). Close some, or reuse connections.",
            code="too_many_connections",
            status=429,
            type="rate_limit_error",
            metadata={
                "limit": "max_connections_per_peer",
                "limit_value": str(limit),
                "retry_after_s": "1",
            },
        )
    return ApiError(
        f"The server holds as many connections as it takes ({limit}, limits.max_connections); "
        "retry shortly or on another replica.",
        code="too_many_connections",
        status=503,
        type="server_error",
        metadata={"limit": "max_connections", "limit_value": str(limit), "retry_after_s": "1"},
    )


class ConnectionAccount:
    """The connections one listener holds, in all and by client address. Event-loop only.

    ``admit`` takes a slot for every accepted connection, refused or not (each holds a
    descriptor until it closes); ``release`` gives it back. A refused connection is kept
    just long enough to be told why (``refusal``), up to ``max_refusing`` of them at once;
    past that, refused connections are closed at once.
    """

    def __init__(self, caps: ConnectionCaps, max_refusing: int = 64) -> None:
        self.limit = caps.http
        self.per_peer = caps.per_peer
        self.max_refusing = max_refusing
        self.open = 0
        self._by_peer: dict[str, int] = {}
        self._refusing: dict[tuple[str, int], ApiError] = {}

    def admit(self, host: str, port: int) -> ApiError | Literal[False] | None:
        """Account for a connection just accepted from ``host:port``: None if it may be
        served, the refusal to answer it with, or False to close it at once (too many are
        already waiting for their refusal). Every outcome but False needs a ``release``."""
        held = self._by_peer.get(host, 0)
        refusal: ApiError | None = None
        if self.per_peer and held >= self.per_peer:
            refusal = too_many_connections(per_peer=True, limit=self.per_peer)
        elif self.limit and self.open - len(self._refusing) >= self.limit:
            refusal = too_many_connections(per_peer=False, limit=self.limit)
        if refusal is not None:
            if len(self._refusing) >= self.max_refusing:
                return False
            self._refusing[(host, port)] = refusal
        else:
            self._by_peer[host] = held + 1
        self.open += 1
        return refusal

    def release(self, host: str, port: int) -> None:
        """A connection admitted by ``admit`` closed."""
        self.open -= 1
        if self._refusing.pop((host, port), None) is not None:
            return
        held = self._by_peer.get(host, 0) - 1
        if held > 0:
            self._by_peer[host] = held
        else:
            self._by_peer.pop(host, None)

    def refusal(self, host: str, port: int) -> ApiError | None:
        """Why the connection from ``host:port`` is refused (None: it is served)."""
        return self._refusing.get((host, port)) if self._refusing else None

    def held_by(self, host: str) -> int:
        """Connections served for ``host`` now."""
        return self._by_peer.get(host, 0)
