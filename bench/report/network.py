"""The network projection "on paper": measured bytes and round trips priced for LAN and WAN."""

from __future__ import annotations

from ..clients import MODES, ModeInfo
from .records import JSONObject

__all__ = ["NETWORK_PROFILES", "network_projection"]


#: The network profiles of the projection "on paper" (not measured here): round-trip time,
#: bandwidth each way, and the round trips a new connection costs before its first request
#: (TCP handshake plus TLS 1.3: 2).
NETWORK_PROFILES: dict[str, dict[str, float]] = {
    "LAN": {"rtt_ms": 0.5, "mbit_s": 1000.0, "handshake_rtts": 2.0},
    "WAN": {"rtt_ms": 40.0, "mbit_s": 50.0, "handshake_rtts": 2.0},
}


def _round_trips(mode: ModeInfo, turns_per_rollout: float) -> tuple[float, float]:
    """(round trips per turn on the critical path, new connections per turn).

    Every turn waits one round trip (request up, first event back; the rest of the stream
    overlaps generation). HTTP mode 1 opens a connection per turn; the other modes one per
    rollout, plus one round trip for the WebSocket upgrade (gRPC's HTTP/2 preface travels with
    the first request).
    """
    per_rollout = 1.0 / max(turns_per_rollout, 1.0)
    if mode.key == "http_new":
        return 1.0, 1.0
    upgrade = per_rollout if mode.transport == "ws" else 0.0
    return 1.0 + upgrade, per_rollout


def network_projection(s: JSONObject) -> list[JSONObject]:
    """Measured bytes and round trips per turn, priced for each profile (added to e2e)."""
    out = []
    for r in s["rows"]:
        mode = MODES[r["mode"]]
        up, down = r.get("bytes_up_per_turn"), r.get("bytes_down_per_turn")
        if up is None or down is None:
            continue
        rtts, connections = _round_trips(mode, r["turns_per_rollout"])
        row: JSONObject = {
            "mode": r["mode"],
            "number": r["number"],
            "label": r["label"],
            "bytes_per_turn": up + down,
            "round_trips_per_turn": rtts,
            "connections_per_turn": connections,
            "measured_e2e_s": r["e2e_median_s"],
        }
        for name, profile in NETWORK_PROFILES.items():
            bytes_per_s = profile["mbit_s"] * 1e6 / 8
            per_turn_ms = (
                profile["rtt_ms"] * (rtts + connections * profile["handshake_rtts"])
                + (up + down) / bytes_per_s * 1000
            )
            row[f"{name}_ms_per_turn"] = per_turn_ms
            row[f"{name}_e2e_s"] = r["e2e_median_s"] + per_turn_ms * r["turns_per_rollout"] / 1000
        out.append(row)
    base = next((row for row in out if row["mode"] == "http_new"), None)
    for row in out:
        for name in NETWORK_PROFILES:
            if base is not None:
                row[f"{name}_speedup"] = base[f"{name}_e2e_s"] / row[f"{name}_e2e_s"]
    return out
