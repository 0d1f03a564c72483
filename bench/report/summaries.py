"""Summaries: the raw turns and runs of each cell reduced to per-mode figures.

See the package docstring for what each figure means.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from ..clients import MODES
from ..run import CellResult
from ..stats import mean, median, percentile
from .records import JSONObject, JSONValue

__all__ = ["summarize"]


def _measured(turns: Iterable[JSONObject]) -> list[JSONObject]:
    return [t for t in turns if not t.get("setup")]


def _turn_figures(turns: list[JSONObject], runs: list[JSONObject]) -> JSONObject:
    """Per-turn figures of one mode in one cell (see the module docstring)."""
    measured = _measured(turns)
    by_repeat: dict[int, list[JSONObject]] = defaultdict(list)
    for t in measured:
        by_repeat[int(t["repeat"])].append(t)
    overhead = [t["overhead_ms"] for t in measured]
    repeat_medians = [median(x["overhead_ms"] for x in ts) for ts in by_repeat.values()]
    total_turn = sum(t["turn_ms"] for t in measured)
    sent = [t["bytes_sent"] for t in measured if t.get("bytes_sent") is not None]
    received = [t["bytes_received"] for t in measured if t.get("bytes_received") is not None]
    if measured and all(t.get("server_cpu_ms") is not None for t in measured):
        # Per-turn readings (one agent): setup turns excluded; one mean per repeat.
        server_cpu = [mean(t["server_cpu_ms"] for t in ts) for ts in by_repeat.values()]
        client_cpu = [mean(t["client_cpu_ms"] for t in ts) for ts in by_repeat.values()]
    else:
        server_cpu = [r["server_cpu_s"] * 1000 / r["responses"] for r in runs if r["responses"]]
        client_cpu = [r["client_cpu_s"] * 1000 / r["responses"] for r in runs if r["responses"]]
    ttft = [t["ttft_ms"] for t in measured if t.get("ttft_ms") is not None]
    # The engine's own process (absent in results of the in-process sim: then None).
    engine_cpu = [
        r["engine_cpu_s"] * 1000 / r["responses"]
        for r in runs
        if r.get("engine_cpu_s") and r["responses"]
    ]
    return {
        "turns": len(measured),
        "overhead_p50_ms": median(overhead),
        "overhead_p99_ms": percentile(overhead, 99),
        "overhead_repeat_medians_ms": repeat_medians,
        "turn_p50_ms": median(t["turn_ms"] for t in measured),
        "ttft_p50_ms": median(ttft),
        "ttft_p99_ms": percentile(ttft, 99),
        "api_share": (sum(overhead) / total_turn) if total_turn else math.nan,
        "api_pre_p50_ms": median(t["api_pre_ms"] for t in measured),
        "api_post_p50_ms": median(t["api_post_ms"] for t in measured),
        # What neither server timer covers: both transports, event encoding and decoding,
        # the client, and the engine's lateness against its own schedule.
        "outside_p50_ms": median(
            t["overhead_ms"] - t["api_pre_ms"] - t["api_post_ms"] for t in measured
        ),
        "server_cpu_ms_per_turn": median(server_cpu),
        "server_cpu_ms_per_turn_range": [min(server_cpu), max(server_cpu)] if server_cpu else None,
        "client_cpu_ms_per_turn": median(client_cpu),
        "engine_cpu_ms_per_turn": median(engine_cpu) if engine_cpu else None,
        "bytes_up_per_turn": mean(sent) if sent else None,
        "bytes_down_per_turn": mean(received) if received else None,
        "events_per_turn": mean(t["events"] for t in measured),
        "messages_per_turn": (
            mean(t["messages"] for t in measured)
            if measured and all(t.get("messages") is not None for t in measured)
            else None
        ),
        "engine_ms_per_turn": mean(t["engine_ms"] for t in measured),
        "tokens_rendered_per_turn": mean(t["tokens_rendered"] for t in measured),
        "stage_ms_per_turn": {
            name: mean(t.get("stage_ms", {}).get(name, 0.0) for t in measured)
            for name in sorted({n for t in measured for n in t.get("stage_ms", {})})
        },
        "tokens_reused_per_turn": mean(t["tokens_reused"] for t in measured),
        "items_validated_per_turn": mean(t["items_validated"] for t in measured),
        "history_tokens_max": max((t["history_tokens"] for t in measured), default=0),
    }


def _rollout_summary(cell: CellResult) -> JSONObject:
    modes = cell.params["modes"]
    rows = []
    for key in modes:
        runs = [r for r in cell.runs if r["mode"] == key]
        turns = [t for t in cell.turns if t["mode"] == key]
        if not runs:
            continue
        e2e = [v for r in runs for v in r["e2e_s"]]
        measured = _measured(turns)
        rows.append(
            {
                "mode": key,
                "number": MODES[key].number,
                "label": MODES[key].label,
                "turns_per_rollout": len(measured) / len(e2e) if e2e else 0,
                "engine_s_per_rollout": (
                    sum(t["engine_ms"] for t in measured) / 1000 / len(e2e) if e2e else 0.0
                ),
                "e2e_median_s": median(e2e),
                "e2e_min_s": min(e2e),
                "e2e_max_s": max(e2e),
                "e2e_s": e2e,
                **_turn_figures(turns, runs),
            }
        )
    base = next((r for r in rows if r["mode"] == "http_new"), None)
    for row in rows:
        if base is not None and row["e2e_median_s"] > 0:
            row["speedup_vs_http_new"] = base["e2e_median_s"] / row["e2e_median_s"]
            row["time_saved_vs_http_new"] = 1 - row["e2e_median_s"] / base["e2e_median_s"]
    return {"name": cell.name, "kind": cell.kind, "params": cell.params, "rows": rows}


def _point(
    cell: CellResult, mode: str, column: str, value: JSONValue
) -> tuple[list[JSONObject], list[JSONObject]]:
    """The runs and turns of one mode at one point of a sweep (``column`` equal to ``value``)."""
    runs = [r for r in cell.runs if r["mode"] == mode and r[column] == value]
    turns = [t for t in cell.turns if t["mode"] == mode and t[column] == value]
    return runs, turns


def _history_summary(cell: CellResult) -> JSONObject:
    rows = []
    for key in cell.params["modes"]:
        for size in cell.params["sizes"]:
            runs, turns = _point(cell, key, "history_target", size)
            if not runs:
                continue
            figures = _turn_figures(turns, runs)
            figures["history_tokens_mean"] = mean(t["history_tokens"] for t in _measured(turns))
            rows.append(
                {"mode": key, "number": MODES[key].number, "history_target": size, **figures}
            )
    growth = {}
    sizes = cell.params["sizes"]
    for key in cell.params["modes"]:
        mine = {r["history_target"]: r for r in rows if r["mode"] == key}
        if sizes and sizes[0] in mine and sizes[-1] in mine:
            low = mine[sizes[0]]["overhead_p50_ms"]
            high = mine[sizes[-1]]["overhead_p50_ms"]
            growth[key] = high / low if low > 0 else math.nan
    return {
        "name": cell.name,
        "kind": cell.kind,
        "params": cell.params,
        "rows": rows,
        "growth": growth,
    }


def _concurrency_summary(cell: CellResult) -> JSONObject:
    rows = []
    for key in cell.params["modes"]:
        for agents in cell.params["agents"]:
            runs, turns = _point(cell, key, "agents", agents)
            if not runs:
                continue
            throughput = [r["responses"] / r["wall_s"] for r in runs if r["wall_s"] > 0]
            rows.append(
                {
                    "mode": key,
                    "number": MODES[key].number,
                    "agents": agents,
                    "throughput_turns_s": median(throughput),
                    "throughput_range": [min(throughput), max(throughput)] if throughput else None,
                    "wall_s": median(r["wall_s"] for r in runs),
                    **_turn_figures(turns, runs),
                }
            )
    return {"name": cell.name, "kind": cell.kind, "params": cell.params, "rows": rows}


def _keepup_summary(cell: CellResult) -> JSONObject:
    rows = [dict(r) for r in cell.runs]
    return {"name": cell.name, "kind": cell.kind, "params": cell.params, "rows": rows}


def _steer_summary(cell: CellResult) -> JSONObject:
    """Per mode: steer sent -> acknowledgement and -> the successor's first token (ms)."""
    rows = []
    for key in cell.params["modes"]:
        rounds = [r for run in cell.runs if run["mode"] == key for r in run["rounds"]]
        ack = [r["ack_ms"] for r in rounds]
        first = [
            r["successor_first_token_ms"]
            for r in rounds
            if r["successor_first_token_ms"] is not None
        ]
        rows.append(
            {
                "mode": key,
                "number": MODES[key].number,
                "label": MODES[key].label,
                "rounds": len(rounds),
                "accepted": sum(1 for r in rounds if r["accepted"]),
                "steered": sum(1 for r in rounds if r["target_reason"] == "steered"),
                "successors_completed": sum(
                    1 for r in rounds if r["successor_status"] == "completed"
                ),
                "ack_ms": ack,
                "successor_first_token_ms": first,
                "ack_p50_ms": percentile(ack, 50),
                "ack_p10_ms": percentile(ack, 10),
                "ack_p90_ms": percentile(ack, 90),
                "successor_first_token_p50_ms": percentile(first, 50),
                "successor_first_token_p10_ms": percentile(first, 10),
                "successor_first_token_p90_ms": percentile(first, 90),
            }
        )
    return {"name": cell.name, "kind": cell.kind, "params": cell.params, "rows": rows}


def _network_summary(cell: CellResult) -> JSONObject:
    """Per link condition and mode: the rollout's figures; per rate, the round-trip time from
    which each stateful mode is 1.40x faster end to end than HTTP with a new connection."""
    rows = []
    conditions = [
        ("direct", rtt, mbit) for rtt in cell.params["rtts_ms"] for mbit in cell.params["mbits"]
    ]
    conditions += [("envoy", rtt, mbit) for rtt, mbit in cell.params.get("mesh") or []]
    conditions += [("multiplex", rtt, mbit) for rtt, mbit in cell.params.get("multiplex") or []]
    conditions += [("lanes", rtt, mbit) for rtt, mbit in cell.params.get("lanes") or []]
    conditions += [("large", rtt, mbit) for rtt, mbit in cell.params.get("large") or []]
    conditions += [("llama", rtt, mbit) for rtt, mbit in cell.params.get("llama") or []]
    for path, rtt, mbit in conditions:
        at = [
            r
            for r in cell.runs
            if r.get("path", "direct") == path and r["rtt_ms"] == rtt and r["mbit"] == mbit
        ]
        ats = [
            t
            for t in cell.turns
            if t.get("path", "direct") == path and t["rtt_ms"] == rtt and t["mbit"] == mbit
        ]
        here: list[JSONObject] = []
        for key in cell.params["modes"]:
            runs = [r for r in at if r["mode"] == key]
            if not runs:
                continue
            turns = [t for t in ats if t["mode"] == key]
            e2e = [v for r in runs for v in r["e2e_s"]]
            proxy = [
                r["proxy_cpu_s"] * 1000 / r["responses"]
                for r in runs
                if r.get("proxy_cpu_s") is not None and r["responses"]
            ]
            here.append(
                {
                    "mode": key,
                    "number": MODES[key].number,
                    "label": MODES[key].label,
                    "path": path,
                    "rtt_ms": rtt,
                    "mbit": mbit,
                    "e2e_median_s": median(e2e),
                    "e2e_min_s": min(e2e),
                    "e2e_max_s": max(e2e),
                    "e2e_s": e2e,
                    "proxy_cpu_ms_per_turn": median(proxy) if proxy else None,
                    **_turn_figures(turns, runs),
                }
            )
        base = next((r for r in here if r["mode"] == "http_new"), None)
        for row in here:
            if base is not None and row["e2e_median_s"] > 0:
                row["speedup_vs_http_new"] = base["e2e_median_s"] / row["e2e_median_s"]
        rows += here
    crossover: JSONObject = {}
    for mbit in cell.params["mbits"]:
        for key in ("grpc_connect", "ws_cache"):
            series = sorted(
                (r["rtt_ms"], r["speedup_vs_http_new"])
                for r in rows
                if r["path"] == "direct"
                and r["mode"] == key
                and r["mbit"] == mbit
                and "speedup_vs_http_new" in r
            )
            crossover[f"{key}@{mbit:g}"] = _first_reaching(series, 1.40)
    return {
        "name": cell.name,
        "kind": cell.kind,
        "params": cell.params,
        "rows": rows,
        "crossover_1_40": crossover,
    }


def _first_reaching(series: Sequence[tuple[float, float]], target: float) -> JSONValue:
    """The smallest x at which a measured (x, y) series reaches ``target``, interpolated
    linearly between the two points around it; None if no point reaches it."""
    previous: tuple[float, float] | None = None
    for x, y in series:
        if y >= target:
            if previous is None or previous[1] >= target:
                return x
            x0, y0 = previous
            return x0 + (target - y0) * (x - x0) / (y - y0)
        previous = (x, y)
    return None


def summarize(cells: Sequence[CellResult]) -> list[JSONObject]:
    """One summary per cell."""
    out = []
    for cell in cells:
        if cell.kind == "rollout":
            out.append(_rollout_summary(cell))
        elif cell.kind == "history":
            out.append(_history_summary(cell))
        elif cell.kind == "concurrency":
            out.append(_concurrency_summary(cell))
        elif cell.kind == "keepup":
            out.append(_keepup_summary(cell))
        elif cell.kind == "steer":
            out.append(_steer_summary(cell))
        elif cell.kind == "network":
            out.append(_network_summary(cell))
    return out
