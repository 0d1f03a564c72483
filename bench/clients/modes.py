"""The modes of the comparison: how each one runs the agent loop, and how a user names them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["CLASSIC_MODES", "MODES", "History", "ModeInfo", "resolve_modes"]

History = Literal["full", "chain", "store", "append"]


@dataclass(frozen=True, slots=True)
class ModeInfo:
    """One way of running the agent loop."""

    number: int
    key: str
    label: str
    transport: Literal["http", "ws", "grpc"]
    history: History
    #: Ask for several events per message (gRPC ``batch_events``; WebSocket: non-standard).
    batch: bool = False
    #: gRPC slim snapshots (``SNAPSHOT_DETAIL_SLIM``).
    slim: bool = False
    #: gRPC ``DeliveryOptions.delta_window_ms`` (None: the client's default, 20 ms; 0: the
    #: server's window).
    delta_window_ms: int | None = None

    @property
    def stateful(self) -> bool:
        """True when the server keeps the conversation in memory between turns."""
        return self.history in ("chain", "append")


MODES: dict[str, ModeInfo] = {
    m.key: m
    for m in (
        ModeInfo(1, "http_new", "HTTP full history, new conn/turn", "http", "full"),
        ModeInfo(2, "http_keepalive", "HTTP full history, keep-alive", "http", "full"),
        ModeInfo(3, "http_store", "HTTP previous_response_id (store)", "http", "store"),
        ModeInfo(4, "ws_cache", "WebSocket, connection cache", "ws", "chain"),
        ModeInfo(5, "ws_append", "WebSocket, append mode", "ws", "append"),
        ModeInfo(6, "grpc_create", "gRPC CreateResponse, full history", "grpc", "full", True),
        ModeInfo(7, "grpc_connect", "gRPC Connect, stream cache", "grpc", "chain", True),
        ModeInfo(8, "grpc_append", "gRPC Connect, append mode", "grpc", "append", True),
        # What a stock client that sets no options gets: no batching, the server's window.
        ModeInfo(
            9, "grpc_single", "gRPC Connect, one event/message", "grpc", "chain", False, False, 0
        ),
        ModeInfo(10, "grpc_slim", "gRPC Connect, slim snapshots", "grpc", "chain", True, True),
        ModeInfo(11, "ws_batched", "WebSocket, batched frames (non-standard)", "ws", "chain", True),
        ModeInfo(
            12,
            "grpc_tokens",
            "gRPC Connect, batched, the server's 2 ms window",
            "grpc",
            "chain",
            True,
            False,
            0,
        ),
    )
}

#: The eight modes of the original comparison (the default of the shorter sweeps).
CLASSIC_MODES = "1,2,3,4,5,6,7,8"


def resolve_modes(spec: str | Sequence[str]) -> list[ModeInfo]:
    """Modes from ``"all"``, numbers (``"1,4,7"``) or keys (``"ws_cache,grpc_connect"``)."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    by_number = {str(m.number): m for m in MODES.values()}
    out: list[ModeInfo] = []
    for raw in parts:
        name = raw.strip()
        if not name:
            continue
        if name == "all":
            out.extend(MODES.values())
        elif name in MODES:
            out.append(MODES[name])
        elif name in by_number:
            out.append(by_number[name])
        else:
            known = ", ".join(f"{m.number}={m.key}" for m in MODES.values())
            raise ValueError(f"unknown mode {name!r} (known: {known}, or 'all')")
    return list(dict.fromkeys(out))
