"""The summaries as text tables, one per kind of cell, in report order.

The tables of the network (the projection on paper and the measured sweep) are in
``network_tables``; the table type and its cell formats in ``table_cells``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from ..clients import MODES
from ..run import window_label
from .network_tables import link_table, projection_table
from .records import JSONObject
from .table_cells import Table, fmt, kb, repeat_range, spread

__all__ = ["summary_tables"]


def summary_tables(summaries: Sequence[JSONObject]) -> list[Table]:
    """Every table of a run, in report order."""
    out = []
    for s in summaries:
        if s["kind"] == "rollout":
            out.append(_rollout_table(s))
            if s["name"] == "headline":
                out.append(projection_table(s))
                out.append(_pre_table(s))
        elif s["kind"] == "history":
            out.append(_history_table(s))
            out.append(_breakdown_table(s))
        elif s["kind"] == "concurrency":
            out.append(_concurrency_table(s))
        elif s["kind"] == "keepup":
            out.append(_keepup_table(s))
        elif s["kind"] == "network":
            out.append(link_table(s))
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
                f"{fmt(r['ack_p50_ms'], 2)} [{fmt(r['ack_p10_ms'], 2)}-{fmt(r['ack_p90_ms'], 2)}]",
                f"{fmt(r['successor_first_token_p50_ms'], 2)} "
                f"[{fmt(r['successor_first_token_p10_ms'], 2)}-"
                f"{fmt(r['successor_first_token_p90_ms'], 2)}]",
            ]
        )
    return Table(title, header, rows)


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
                spread(r["overhead_p50_ms"], repeat_range(r), 2),
                fmt(r["overhead_p99_ms"], 2),
                fmt(r["api_share"] * 100, 1),
                fmt(r["ttft_p50_ms"], 1),
                spread(r["server_cpu_ms_per_turn"], r.get("server_cpu_ms_per_turn_range"), 1),
                fmt(r.get("engine_cpu_ms_per_turn"), 1),
                fmt(r["client_cpu_ms_per_turn"], 1),
                kb(r["bytes_up_per_turn"]),
                kb(r["bytes_down_per_turn"]),
                fmt(r["events_per_turn"], 0),
                fmt(r.get("messages_per_turn"), 1) if r.get("messages_per_turn") else "-",
                fmt(r["tokens_rendered_per_turn"], 0),
            ]
        )
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
                    spread(mine[size]["overhead_p50_ms"], repeat_range(mine[size]), 2)
                    if size in mine
                    else "-"
                    for size in sizes
                ],
                fmt(s["growth"].get(key), 2),
                fmt(top.get("tokens_rendered_per_turn"), 0),
                spread(
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
                    f"{spread(mine[n]['throughput_turns_s'], mine[n]['throughput_range'], 1)} "
                    f"({mine[n]['overhead_p50_ms']:.1f})"
                    if n in mine
                    else "-"
                    for n in agents
                ],
                spread(
                    top.get("server_cpu_ms_per_turn"), top.get("server_cpu_ms_per_turn_range"), 1
                ),
                fmt(top.get("engine_cpu_ms_per_turn"), 1),
                fmt(top.get("client_cpu_ms_per_turn"), 1),
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
            fmt(r["api_pre_p50_ms"], 2),
            *[fmt(r.get("stage_ms_per_turn", {}).get(n), 2) for n in stages],
            fmt(r["items_validated_per_turn"], 1),
            fmt(r["tokens_rendered_per_turn"], 0),
            fmt(r["tokens_reused_per_turn"], 0),
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
                spread(r["overhead_p50_ms"], repeat_range(r), 2),
                fmt(r["api_pre_p50_ms"], 2),
                fmt(r["api_post_p50_ms"], 2),
                fmt(r["outside_p50_ms"], 2),
                fmt(r["ttft_p50_ms"], 1),
                fmt(r["events_per_turn"], 0),
                kb(r["bytes_up_per_turn"]),
                kb(r["bytes_down_per_turn"]),
                spread(r["server_cpu_ms_per_turn"], r.get("server_cpu_ms_per_turn_range"), 1),
                fmt(r["client_cpu_ms_per_turn"], 1),
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
