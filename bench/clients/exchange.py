"""One exchange on a connection: what the client saw of a turn, and the connection protocol."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from ..jsontypes import JSONObject
from ..wire import SocketBytes, WireCounter

__all__ = ["BenchError", "Conn", "Exchange", "ServerAddress", "wire_snapshot"]


class BenchError(RuntimeError):
    """A turn failed (error event, failed response, HTTP error): the run is not valid."""


@dataclass(frozen=True, slots=True)
class ServerAddress:
    """Where the server under test listens."""

    host: str
    grpc_port: int
    http_port: int | None
    #: The server's process id, for reading its CPU time per turn (same machine).
    pid: int | None = None
    #: The CA (PEM file) of the server's certificate: clients then connect over TLS.
    tls_ca: str | None = None

    @property
    def ports(self) -> list[int]:
        """Every port the server listens on (for byte accounting)."""
        return [p for p in (self.grpc_port, self.http_port) if p]


# -- one exchange on a connection ---------------------------------------------------------

_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})


@dataclass(slots=True)
class Exchange:
    """What a client saw of one turn: timestamps (perf_counter), counts, the last event."""

    t_send: float
    t_end: float = 0.0
    t_first_event: float | None = None
    t_first_delta: float | None = None
    t_last_delta: float | None = None
    events: int = 0
    #: Transport messages (gRPC messages, WebSocket frames, SSE events) that carried the
    #: events; None where the client cannot see them (CreateResponse).
    messages: int | None = None
    deltas: int = 0
    final: JSONObject = field(default_factory=dict)
    wire_after: SocketBytes | None = None

    def observe(self, event: JSONObject) -> bool:
        """Count one event; True when it ends the turn."""
        now = time.perf_counter()
        self.events += 1
        if self.t_first_event is None:
            self.t_first_event = now
        kind = event.get("type", "")
        if kind.endswith(".delta"):
            self.deltas += 1
            if self.t_first_delta is None:
                self.t_first_delta = now
            self.t_last_delta = now
            return False
        if kind in _TERMINAL or kind == "error" or kind == "response.done":
            self.t_end = now
            self.final = event
            return True
        return False


class Conn(Protocol):
    """One client connection of a mode (opened per rollout or shared by agents)."""

    async def create(self, body: JSONObject) -> Exchange:
        """Send a create and read events up to the turn's end."""
        ...

    async def append(self, response_id: str, items: list[JSONObject]) -> Exchange:
        """Send tool outputs to a waiting response (append modes only)."""
        ...

    async def aclose(self, abort: bool = False) -> None:
        """Close what this connection owns; ``abort`` drops a response still waiting."""
        ...


def wire_snapshot(wire: WireCounter | None) -> SocketBytes | None:
    return wire.snapshot() if wire is not None else None
