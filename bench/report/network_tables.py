"""The network tables: the headline priced on paper per link, and the measured network sweep."""

from __future__ import annotations

from .network import NETWORK_PROFILES, network_projection
from .records import JSONObject
from .table_cells import Table, fmt, kb

__all__ = ["link_table", "projection_table"]


def projection_table(s: JSONObject) -> Table:
    """The headline's bytes and round trips priced on paper for each network profile."""
    profiles = "; ".join(
        f"{name}: RTT {p['rtt_ms']:g} ms, {p['mbit_s']:g} Mbit/s each way, "
        f"{p['handshake_rtts']:g} RTT per new connection (TCP + TLS 1.3)"
        for name, p in NETWORK_PROFILES.items()
    )
    title = (
        f"{s['name']}: network projection ON PAPER, not measured: this run's bytes and round "
        f"trips per turn priced for {profiles}; e2e = measured loopback e2e + turns x "
        "(round trips x RTT + bytes / bandwidth)"
    )
    header = ["#", "mode", "KB/turn", "RTT/turn", "new conn/turn"]
    for name in NETWORK_PROFILES:
        header += [f"{name} +ms/turn", f"{name} e2e s", f"{name} vs 1"]
    rows = []
    for r in network_projection(s):
        row = [
            str(r["number"]),
            r["label"],
            kb(r["bytes_per_turn"]),
            fmt(r["round_trips_per_turn"], 2),
            fmt(r["connections_per_turn"], 2),
        ]
        for name in NETWORK_PROFILES:
            row += [
                fmt(r[f"{name}_ms_per_turn"], 2),
                fmt(r[f"{name}_e2e_s"], 3),
                f"{r[f'{name}_speedup']:.2f}x" if f"{name}_speedup" in r else "-",
            ]
        rows.append(row)
    return Table(title, header, rows)


#: The network table's path column: straight to the server, through Envoy, many agents.
_PATHS = {
    "direct": "direct",
    "envoy": "Envoy",
    "multiplex": "{agents} agents",
    "lanes": "{agents} lanes",
    "large": "large outputs",
    "llama": "llama.cpp",
}


def link_table(s: JSONObject) -> Table:
    """The network sweep: each mode's rollout through each emulated link."""
    p = s["params"]
    title = (
        f"network: the rollout ({p['workload'].get('tool_turns', '?')} tool turns) through an "
        f"emulated link, {'TLS' if p.get('tls') else 'plain TCP'}, "
        f"{p['tokens_per_second']:g} tok/s, {p['repeats']} repeats; "
        "e2e s median (min-max), speedup vs HTTP new connection at the same link"
    )
    header = [
        "path",
        "RTT ms",
        "Mbit/s",
        "#",
        "mode",
        "e2e s",
        "speedup",
        "overhead p50 ms",
        "srv CPU ms/turn",
        "cli CPU ms/turn",
        "engine CPU ms/turn",
        "Envoy CPU ms/turn",
        "KB up/turn",
        "KB down/turn",
    ]
    rows = []
    for r in s["rows"]:
        rows.append(
            [
                _PATHS.get(r.get("path", "direct"), "direct").format(
                    agents=p.get("multiplex_agents", "?")
                ),
                f"{r['rtt_ms']:g}",
                f"{r['mbit']:g}" if r["mbit"] else "unlimited",
                str(r["number"]),
                r["label"],
                f"{r['e2e_median_s']:.2f} ({r['e2e_min_s']:.2f}-{r['e2e_max_s']:.2f})",
                f"{r['speedup_vs_http_new']:.2f}x" if "speedup_vs_http_new" in r else "-",
                fmt(r["overhead_p50_ms"], 1),
                fmt(r["server_cpu_ms_per_turn"], 1),
                fmt(r["client_cpu_ms_per_turn"], 1),
                fmt(r.get("engine_cpu_ms_per_turn"), 1),
                fmt(r.get("proxy_cpu_ms_per_turn"), 1),
                kb(r["bytes_up_per_turn"]),
                kb(r["bytes_down_per_turn"]),
            ]
        )
    return Table(title, header, rows)
