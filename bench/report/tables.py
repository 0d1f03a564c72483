"""The summaries as text tables: (title, header, rows) of strings, for the terminal and Markdown."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ..clients import MODES
from ..run import window_label
from .network import NETWORK_PROFILES, network_projection
from .records import JSONObject, JSONValue

__all__ = ["Table", "aligned", "summary_tables"]


class Table(NamedTuple):
    """One table: its title, column headers and rows, every cell already text."""

    title: str
    header: list[str]
    rows: list[list[str]]


def summary_tables(summaries: Sequence[JSONObject]) -> list[Table]:
    """Every table of a run, in report order."""
    out = []
    for s in summaries:
        if s["kind"] == "rollout":
            out.append(_rollout_table(s))
            if s["name"] == "headline":
                out.append(_network_table(s))
                out.append(_pre_table(s))
        elif s["kind"] == "history":
            out.append(_history_table(s))
            out.append(_breakdown_table(s))
        elif s["kind"] == "concurrency":
            out.append(_concurrency_table(s))
        elif s["kind"] == "keepup":
            out.append(_keepup_table(s))
        elif s["kind"] == "network":
            out.append(_link_table(s))
    # Steering sits beside the network projection (after it when the headline ran).
    steering = [_steer_table(s) for s in summaries if s["kind"] == "steer"]
    at = next((i + 1 for i, t in enumerate(out) if "network projection" in t.title), len(out))
    return out[:at] + steering + out[at:]


def _steer_table(s: JSONObject) -> Table:
    p = s["params"]
    title = (
        f"steering: {p['rounds']} responses per mode and repeat x {p['repeats']} repeats, each "
        "steered 5 ms after its create (after its response.created); engine "
        f"{p['ttft_ms']:g} ms to a first token, "
        f"{p['tokens_per_second']:g} tok/s; ms from the steer's send, p50 [p10-p90]"
    )
    header = [
        "#",
        "mode",
        "rounds",
        "accepted",
        "steered",
        "successors",
        "steer -> ack ms",
        "steer -> successor 1st token ms",
    ]
    rows = []
    for r in s["rows"]:
        rows.append(
            [
                str(r["number"]),
                r["label"],
                str(r["rounds"]),
                str(r["accepted"]),
                str(r["steered"]),
                str(r["successors_completed"]),
                f"{_fmt(r['ack_p50_ms'], 2)} [{_fmt(r['ack_p10_ms'], 2)}-"
                f"{_fmt(r['ack_p90_ms'], 2)}]",
                f"{_fmt(r['successor_first_token_p50_ms'], 2)} "
                f"[{_fmt(r['successor_first_token_p10_ms'], 2)}-"
                f"{_fmt(r['successor_first_token_p90_ms'], 2)}]",
            ]
        )
    return Table(title, header, rows)


def _fmt(value: JSONValue, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _spread(value: JSONValue, low_high: JSONValue, digits: int = 1) -> str:
    """``value [low-high]``: a median and its range over repeats (just the value without one)."""
    text = _fmt(value, digits)
    if isinstance(low_high, list) and len(low_high) == 2 and low_high[0] != low_high[1]:
        text += f" [{_fmt(low_high[0], digits)}-{_fmt(low_high[1], digits)}]"
    return text


def _repeat_range(row: JSONObject) -> list[float] | None:
    """The range of the per-repeat median overheads of a row (None with fewer than 2)."""
    medians = row.get("overhead_repeat_medians_ms") or []
    return [min(medians), max(medians)] if len(medians) > 1 else None


def _kb(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value / 1024:.1f}"


def _rollout_table(s: JSONObject) -> Table:
    p = s["params"]
    w = p["workload"]
    source = f"trace {Path(p['trace']).name}, " if p.get("trace") else ""
    title = (
        f"{s['name']}: {source}{p['tokens_per_second']:g} tok/s, {w['tool_turns']} tool turns x "
        f"{w['tool_output_tokens']}-token outputs, {p['repeats']} repeat(s)"
    )
    header = [
        "#",
        "mode",
        "e2e s (min-max)",
        "vs 1",
        "ovh p50 ms [repeats]",
        "ovh p99 ms",
        "API %",
        "TTFT p50 ms",
        "srv CPU ms/turn [repeats]",
        "engine CPU ms/turn",
        "cli CPU ms/turn",
        "KB up/turn",
        "KB down/turn",
        "events/turn",
        "wire msgs/turn",
        "tok rendered/turn",
    ]
    rows = []
    for r in s["rows"]:
        rows.append(
            [
                str(r["number"]),
                r["label"],
                f"{r['e2e_median_s']:.3f} ({r['e2e_min_s']:.3f}-{r['e2e_max_s']:.3f})",
                f"{r['speedup_vs_http_new']:.2f}x" if "speedup_vs_http_new" in r else "-",
                _spread(r["overhead_p50_ms"], _repeat_range(r), 2),
                _fmt(r["overhead_p99_ms"], 2),
                _fmt(r["api_share"] * 100, 1),
                _fmt(r["ttft_p50_ms"], 1),
                _spread(r["server_cpu_ms_per_turn"], r.get("server_cpu_ms_per_turn_range"), 1),
                _fmt(r.get("engine_cpu_ms_per_turn"), 1)
                if r.get("engine_cpu_ms_per_turn") is not None
                else "-",
                _fmt(r["client_cpu_ms_per_turn"], 1),
                _kb(r["bytes_up_per_turn"]),
                _kb(r["bytes_down_per_turn"]),
                _fmt(r["events_per_turn"], 0),
                _fmt(r.get("messages_per_turn"), 1) if r.get("messages_per_turn") else "-",
                _fmt(r["tokens_rendered_per_turn"], 0),
            ]
        )
    return Table(title, header, rows)


def _network_table(s: JSONObject) -> Table:
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
            _kb(r["bytes_per_turn"]),
            _fmt(r["round_trips_per_turn"], 2),
            _fmt(r["connections_per_turn"], 2),
        ]
        for name in NETWORK_PROFILES:
            row += [
                _fmt(r[f"{name}_ms_per_turn"], 2),
                _fmt(r[f"{name}_e2e_s"], 3),
                f"{r[f'{name}_speedup']:.2f}x" if f"{name}_speedup" in r else "-",
            ]
        rows.append(row)
    return Table(title, header, rows)


def _history_table(s: JSONObject) -> Table:
    p = s["params"]
    sizes = p["sizes"]
    title = (
        f"history sweep: median API overhead per turn (ms) of {p['small_turns']} small "
        f"turns ({p['small_tokens']}-token tool outputs) on a prefilled history, "
        f"{p['repeats']} repeat(s), [range of the per-repeat medians]; growth: "
        "largest/smallest"
    )
    header = [
        "#",
        "mode",
        *[f"{size // 1000}k" for size in sizes],
        "growth",
        "tok rendered/turn @max",
        "srv CPU ms/turn @max",
    ]
    rows = []
    for key in p["modes"]:
        mine = {r["history_target"]: r for r in s["rows"] if r["mode"] == key}
        top = mine.get(sizes[-1], {})
        rows.append(
            [
                str(MODES[key].number),
                MODES[key].label,
                *[
                    _spread(mine[size]["overhead_p50_ms"], _repeat_range(mine[size]), 2)
                    if size in mine
                    else "-"
                    for size in sizes
                ],
                _fmt(s["growth"].get(key), 2),
                _fmt(top.get("tokens_rendered_per_turn"), 0),
                _spread(
                    top.get("server_cpu_ms_per_turn"), top.get("server_cpu_ms_per_turn_range"), 1
                ),
            ]
        )
    return Table(title, header, rows)


def _concurrency_table(s: JSONObject) -> Table:
    p = s["params"]
    agents = p["agents"]
    w = p["workload"]
    window = p.get("delta_window_ms") or 0.0
    workers = p.get("workers", 1)
    title = (
        f"{s['name']}: throughput in turns/s (median of {p['repeats']}) with N agents, "
        f"server with {workers} worker process{'es' if workers > 1 else ''}, "
        f"delta {window_label(window)}, "
        f"{w['tool_turns']} tool turns x {w['tool_output_tokens']} tokens each, agents "
        f"spread over {p['processes']} client processes; [min-max over repeats], p50 "
        "overhead ms in brackets"
    )
    header = [
        "#",
        "mode",
        *[f"{n} agents" for n in agents],
        "srv CPU ms/turn @max",
        "engine CPU ms/turn @max",
        "cli CPU ms/turn @max",
    ]
    rows = []
    for key in p["modes"]:
        mine = {r["agents"]: r for r in s["rows"] if r["mode"] == key}
        top = mine.get(agents[-1], {})
        rows.append(
            [
                str(MODES[key].number),
                MODES[key].label,
                *[
                    f"{_spread(mine[n]['throughput_turns_s'], mine[n]['throughput_range'], 1)} "
                    f"({mine[n]['overhead_p50_ms']:.1f})"
                    if n in mine
                    else "-"
                    for n in agents
                ],
                _spread(
                    top.get("server_cpu_ms_per_turn"), top.get("server_cpu_ms_per_turn_range"), 1
                ),
                _fmt(top.get("engine_cpu_ms_per_turn"), 1)
                if top.get("engine_cpu_ms_per_turn") is not None
                else "-",
                _fmt(top.get("client_cpu_ms_per_turn"), 1),
            ]
        )
    return Table(title, header, rows)


def _pre_table(s: JSONObject) -> Table:
    stages = sorted({n for r in s["rows"] for n in r.get("stage_ms_per_turn", {})})
    title = (
        f"{s['name']}: the server's pre-inference work per turn (api pre = request receipt to "
        "engine start, median ms; stages = pipeline stages, mean ms; counters = means)"
    )
    header = [
        "#",
        "mode",
        "api pre ms",
        *[f"{n} ms" for n in stages],
        "items validated",
        "tok rendered",
        "tok reused",
    ]
    rows = [
        [
            str(r["number"]),
            r["label"],
            _fmt(r["api_pre_p50_ms"], 2),
            *[_fmt(r.get("stage_ms_per_turn", {}).get(n), 2) for n in stages],
            _fmt(r["items_validated_per_turn"], 1),
            _fmt(r["tokens_rendered_per_turn"], 0),
            _fmt(r["tokens_reused_per_turn"], 0),
        ]
        for r in s["rows"]
    ]
    return Table(title, header, rows)


def _breakdown_table(s: JSONObject) -> Table:
    p = s["params"]
    size = p["sizes"][0]
    title = (
        f"small turns at {size // 1000}k history: where the API overhead goes (medians, ms; "
        "pre/post = the server's own timers, outside = transports, event encode/decode, "
        "client, engine lateness)"
    )
    header = [
        "#",
        "mode",
        "overhead",
        "api pre",
        "api post",
        "outside",
        "TTFT",
        "msgs/turn",
        "KB up/turn",
        "KB down/turn",
        "srv CPU ms/turn",
        "cli CPU ms/turn",
    ]
    rows = []
    for r in s["rows"]:
        if r["history_target"] != size:
            continue
        rows.append(
            [
                str(r["number"]),
                MODES[r["mode"]].label,
                _spread(r["overhead_p50_ms"], _repeat_range(r), 2),
                _fmt(r["api_pre_p50_ms"], 2),
                _fmt(r["api_post_p50_ms"], 2),
                _fmt(r["outside_p50_ms"], 2),
                _fmt(r["ttft_p50_ms"], 1),
                _fmt(r["events_per_turn"], 0),
                _kb(r["bytes_up_per_turn"]),
                _kb(r["bytes_down_per_turn"]),
                _spread(r["server_cpu_ms_per_turn"], r.get("server_cpu_ms_per_turn_range"), 1),
                _fmt(r["client_cpu_ms_per_turn"], 1),
            ]
        )
    return Table(title, header, rows)


def _keepup_table(s: JSONObject) -> Table:
    p = s["params"]
    title = (
        f"keep-up: one stream, {p['answer_tokens']}-token answers at "
        f"{p['tokens_per_second']:g} tok/s, {p['responses']} responses per row"
    )
    header = [
        "mode",
        "delta merging",
        "delivered tok/s",
        "delivery %",
        "tokens/msg",
        "msgs/response",
        "server % of a core",
    ]
    rows = []
    for r in s["rows"]:
        rows.append(
            [
                r["mode"],
                r["policy"],
                f"{r['delivered_tps']:.0f}",
                f"{r['delivery'] * 100:.1f}",
                f"{r['tokens_per_message']:.1f}",
                f"{statistics.median(r['deltas_per_response']):.0f}"
                if r["deltas_per_response"]
                else "-",
                f"{r['server_core_share'] * 100:.1f}",
            ]
        )
    return Table(title, header, rows)


def aligned(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


#: The network table's path column: straight to the server, through Envoy, many agents.
_PATHS = {
    "direct": "direct",
    "envoy": "Envoy",
    "multiplex": "{agents} agents",
    "lanes": "{agents} lanes",
    "large": "large outputs",
    "llama": "llama.cpp",
}


def _link_table(s: JSONObject) -> Table:
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
                _fmt(r["overhead_p50_ms"], 1),
                _fmt(r["server_cpu_ms_per_turn"], 1),
                _fmt(r["client_cpu_ms_per_turn"], 1),
                _fmt(r.get("engine_cpu_ms_per_turn"), 1)
                if r.get("engine_cpu_ms_per_turn") is not None
                else "-",
                _fmt(r.get("proxy_cpu_ms_per_turn"), 1)
                if r.get("proxy_cpu_ms_per_turn") is not None
                else "-",
                _kb(r["bytes_up_per_turn"]),
                _kb(r["bytes_down_per_turn"]),
            ]
        )
    return Table(title, header, rows)
