"""Figures from raw cells: tables for the terminal, JSON, CSV, PNG plots and a Markdown draft.

Conventions, so every number means one thing:

* *Per-turn* figures (overhead, TTFT, turn time) are medians and p99 over every measured turn
  of every repeat; *spread* is the range of the per-repeat medians.
* *End-to-end* is one rollout, first request to final answer; the table gives the median over
  repeats and the min-max range.
* *API overhead* of a turn is the client-observed turn time minus the engine time the server
  reports for that turn (``response.stats.engine_ms``); the *API share* is total overhead over
  total turn time.
* *Server CPU per turn* is the server process's CPU time (all threads, ``cpu.py``) used per
  turn: read by the client at every turn boundary when one agent runs (setup turns
  excluded), else the run's total over its turns. It includes the simulated engine's own
  work (pacing, hashing the prompt for its prefix cache), identical in every mode.
  *Client CPU* is the same for the client process (its share of the two cores matters).
* *Bytes* are TCP payload bytes on the client's sockets (``wire.py``): request direction
  ("up") and response direction ("down"), per turn.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from bidi_responses.bench.clients import MODES, ModeInfo
from bidi_responses.bench.run import (
    DEFAULT_DELTA_WINDOW_MS,
    CellResult,
    CompareConfig,
    window_label,
)

__all__ = [
    "Report",
    "build_report",
    "machine_info",
    "percentile",
    "write_outputs",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between closest ranks; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (pos - low))


def _median(values: Iterable[float]) -> float:
    data = [v for v in values if v is not None and not math.isnan(v)]
    return float(statistics.median(data)) if data else math.nan


def _mean(values: Iterable[float]) -> float:
    data = [v for v in values if v is not None]
    return float(sum(data) / len(data)) if data else math.nan


def machine_info() -> dict[str, Any]:
    """Machine, interpreter and library versions, for the results file."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for name in (
        "grpcio",
        "protobuf",
        "websockets",
        "aiohttp",
        "uvicorn",
        "starlette",
        "orjson",
        "tiktoken",
        "psutil",
        "matplotlib",
    ):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    memory = None
    try:
        import psutil

        memory = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # pragma: no cover - psutil is a bench dependency
        pass
    kernel = platform.release()
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": memory,
        "kernel": kernel,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": versions,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "git_commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# -- summaries ----------------------------------------------------------------------------


def _measured(turns: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in turns if not t.get("setup")]


def _turn_figures(turns: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-turn figures of one mode in one cell (see the module docstring)."""
    measured = _measured(turns)
    by_repeat: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for t in measured:
        by_repeat[int(t["repeat"])].append(t)
    overhead = [t["overhead_ms"] for t in measured]
    repeat_medians = [_median(x["overhead_ms"] for x in ts) for ts in by_repeat.values()]
    total_turn = sum(t["turn_ms"] for t in measured)
    sent = [t["bytes_sent"] for t in measured if t.get("bytes_sent") is not None]
    received = [t["bytes_received"] for t in measured if t.get("bytes_received") is not None]
    if measured and all(t.get("server_cpu_ms") is not None for t in measured):
        # Per-turn readings (one agent): setup turns excluded; one mean per repeat.
        server_cpu = [_mean(t["server_cpu_ms"] for t in ts) for ts in by_repeat.values()]
        client_cpu = [_mean(t["client_cpu_ms"] for t in ts) for ts in by_repeat.values()]
    else:
        server_cpu = [r["server_cpu_s"] * 1000 / r["responses"] for r in runs if r["responses"]]
        client_cpu = [r["client_cpu_s"] * 1000 / r["responses"] for r in runs if r["responses"]]
    ttft = [t["ttft_ms"] for t in measured if t.get("ttft_ms") is not None]
    return {
        "turns": len(measured),
        "overhead_p50_ms": _median(overhead),
        "overhead_p99_ms": percentile(overhead, 99),
        "overhead_repeat_medians_ms": repeat_medians,
        "turn_p50_ms": _median(t["turn_ms"] for t in measured),
        "ttft_p50_ms": _median(ttft),
        "ttft_p99_ms": percentile(ttft, 99),
        "api_share": (sum(overhead) / total_turn) if total_turn else math.nan,
        "api_pre_p50_ms": _median(t["api_pre_ms"] for t in measured),
        "api_post_p50_ms": _median(t["api_post_ms"] for t in measured),
        # What neither server timer covers: both transports, event encoding and decoding,
        # the client, and the engine's lateness against its own schedule.
        "outside_p50_ms": _median(
            t["overhead_ms"] - t["api_pre_ms"] - t["api_post_ms"] for t in measured
        ),
        "server_cpu_ms_per_turn": _median(server_cpu),
        "server_cpu_ms_per_turn_range": [min(server_cpu), max(server_cpu)] if server_cpu else None,
        "client_cpu_ms_per_turn": _median(client_cpu),
        "bytes_up_per_turn": _mean(sent) if sent else None,
        "bytes_down_per_turn": _mean(received) if received else None,
        "events_per_turn": _mean(t["events"] for t in measured),
        "messages_per_turn": (
            _mean(t["messages"] for t in measured)
            if measured and all(t.get("messages") is not None for t in measured)
            else None
        ),
        "engine_ms_per_turn": _mean(t["engine_ms"] for t in measured),
        "tokens_rendered_per_turn": _mean(t["tokens_rendered"] for t in measured),
        "stage_ms_per_turn": {
            name: _mean(t.get("stage_ms", {}).get(name, 0.0) for t in measured)
            for name in sorted({n for t in measured for n in t.get("stage_ms", {})})
        },
        "tokens_reused_per_turn": _mean(t["tokens_reused"] for t in measured),
        "items_validated_per_turn": _mean(t["items_validated"] for t in measured),
        "history_tokens_max": max((t["history_tokens"] for t in measured), default=0),
    }


def _rollout_summary(cell: CellResult) -> dict[str, Any]:
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
                "e2e_median_s": _median(e2e),
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


def _history_summary(cell: CellResult) -> dict[str, Any]:
    rows = []
    for key in cell.params["modes"]:
        for size in cell.params["sizes"]:
            runs = [r for r in cell.runs if r["mode"] == key and r["history_target"] == size]
            turns = [t for t in cell.turns if t["mode"] == key and t["history_target"] == size]
            if not runs:
                continue
            figures = _turn_figures(turns, runs)
            figures["history_tokens_mean"] = _mean(t["history_tokens"] for t in _measured(turns))
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


def _concurrency_summary(cell: CellResult) -> dict[str, Any]:
    rows = []
    for key in cell.params["modes"]:
        for agents in cell.params["agents"]:
            runs = [r for r in cell.runs if r["mode"] == key and r["agents"] == agents]
            turns = [t for t in cell.turns if t["mode"] == key and t["agents"] == agents]
            if not runs:
                continue
            throughput = [r["responses"] / r["wall_s"] for r in runs if r["wall_s"] > 0]
            rows.append(
                {
                    "mode": key,
                    "number": MODES[key].number,
                    "agents": agents,
                    "throughput_turns_s": _median(throughput),
                    "throughput_range": [min(throughput), max(throughput)] if throughput else None,
                    "wall_s": _median(r["wall_s"] for r in runs),
                    **_turn_figures(turns, runs),
                }
            )
    return {"name": cell.name, "kind": cell.kind, "params": cell.params, "rows": rows}


def _keepup_summary(cell: CellResult) -> dict[str, Any]:
    rows = [dict(r) for r in cell.runs]
    return {"name": cell.name, "kind": cell.kind, "params": cell.params, "rows": rows}


def summarize(cells: Sequence[CellResult]) -> list[dict[str, Any]]:
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
    return out


# -- targets ------------------------------------------------------------------------------


def _target(
    tid: str, text: str, measured: float | None, met: bool | None, detail: str
) -> dict[str, Any]:
    return {"id": tid, "target": text, "measured": measured, "met": met, "detail": detail}


def evaluate_targets(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, judged on this run (None: not measured in this run)."""
    by_name = {s["name"]: s for s in summaries}
    targets = []
    head = by_name.get("headline")
    rows = {r["mode"]: r for r in head["rows"]} if head else {}
    if "grpc_connect" in rows and "http_new" in rows:
        g, h = rows["grpc_connect"], rows["http_new"]
        speedup = h["e2e_median_s"] / g["e2e_median_s"]
        saved = 1 - g["e2e_median_s"] / h["e2e_median_s"]
        targets.append(
            _target(
                "T1",
                "gRPC Connect >= 40% faster end to end than HTTP full history, new "
                "connection per turn (speedup >= 1.40x)",
                speedup,
                speedup >= 1.40,
                f"{g['e2e_median_s']:.2f} s vs {h['e2e_median_s']:.2f} s: {speedup:.2f}x, "
                f"{saved * 100:.1f}% less time",
            )
        )
    if "grpc_connect" in rows and "ws_cache" in rows:
        ratio = rows["grpc_connect"]["e2e_median_s"] / rows["ws_cache"]["e2e_median_s"]
        targets.append(
            _target(
                "T2",
                "gRPC Connect no slower than WebSocket mode (e2e ratio <= 1.05)",
                ratio,
                ratio <= 1.05,
                f"{rows['grpc_connect']['e2e_median_s']:.3f} s vs "
                f"{rows['ws_cache']['e2e_median_s']:.3f} s",
            )
        )
    hist = by_name.get("history")
    if hist:
        growth = hist["growth"]
        sizes = hist["params"]["sizes"]
        for key, value in growth.items():
            stateful = MODES[key].stateful
            if stateful:
                targets.append(
                    _target(
                        f"T3-{key}",
                        f"{key}: overhead at {sizes[-1] // 1000}k history <= 1.2x "
                        f"overhead at {sizes[0] // 1000}k",
                        value,
                        value <= 1.2,
                        f"ratio {value:.2f}",
                    )
                )
        full = {k: v for k, v in growth.items() if MODES[k].history in ("full", "store")}
        if full:
            worst = min(full.values())
            targets.append(
                _target(
                    "T3-full",
                    "full-history modes' overhead grows with history",
                    worst,
                    worst > 1.2,
                    "; ".join(f"{k} x{v:.1f}" for k, v in full.items()),
                )
            )
        small = {
            r["mode"]: r["overhead_p50_ms"] for r in hist["rows"] if r["history_target"] == sizes[0]
        }
        if "grpc_connect" in small:
            value = small["grpc_connect"]
            ws = small.get("ws_cache")
            ok = value <= 1.5 and (ws is None or value <= ws)
            targets.append(
                _target(
                    "T4",
                    "small-turn API overhead of gRPC Connect <= WebSocket mode's and <= 1.5 ms "
                    "median",
                    value,
                    ok,
                    f"{value:.2f} ms median at {sizes[0] // 1000}k history, "
                    f"{hist['params']['small_tokens']}-token tool outputs"
                    + (f"; WebSocket {ws:.2f} ms" if ws is not None else "")
                    + "".join(
                        f"; {k} {v:.2f} ms"
                        for k, v in small.items()
                        if k in ("grpc_single", "ws_batched", "grpc_append", "ws_append")
                    ),
                )
            )
    keep = by_name.get("keepup")
    if keep:
        merged = [
            r for r in keep["rows"] if r["mode"] == "grpc_connect" and r["window_ms"] is not None
        ]
        # Judged with the server's defaults when that row was run, else the best merging policy.
        default = [r for r in merged if r["window_ms"] == DEFAULT_DELTA_WINDOW_MS]
        if merged:
            best = (
                default[0]
                if default
                else max(merged, key=lambda r: (r["delivery"] >= 0.97, -r["server_core_share"]))
            )
            ok = best["delivery"] >= 0.99 and best["server_core_share"] <= 0.10
            targets.append(
                _target(
                    "T5",
                    "one Connect stream keeps up with a 4,000 tok/s engine (delivery >= 99%) "
                    "using <= 10% of a core on the server",
                    best["server_core_share"],
                    ok,
                    f"{best['policy']}: delivery {best['delivery'] * 100:.1f}%, server "
                    f"{best['server_core_share'] * 100:.1f}% of a core"
                    + "".join(
                        f"; {r['policy']}: {r['delivery'] * 100:.1f}%, "
                        f"{r['server_core_share'] * 100:.1f}% of a core"
                        for r in keep["rows"]
                        if r["mode"] == "grpc_connect" and r is not best
                    ),
                )
            )
    targets += _issue11_targets(by_name, rows)
    return targets


def _issue11_targets(
    by_name: dict[str, dict[str, Any]], head: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Server CPU, throughput, worker scaling and overhead removed (T6-T10)."""
    targets = []
    if "grpc_connect" in head and "ws_cache" in head:
        g = head["grpc_connect"]["server_cpu_ms_per_turn"]
        w = head["ws_cache"]["server_cpu_ms_per_turn"]
        others = "".join(
            f"; {k} {head[k]['server_cpu_ms_per_turn']:.1f} ms"
            for k in ("grpc_single", "grpc_slim", "ws_batched")
            if k in head
        )
        targets.append(
            _target(
                "T6",
                "gRPC Connect server CPU per agent turn <= WebSocket mode's (headline)",
                g / w if w else None,
                g <= w,
                f"{g:.1f} vs {w:.1f} ms per turn{others}",
            )
        )
    conc = by_name.get("concurrency")
    top: dict[str, dict[str, Any]] = {}
    if conc:
        most = max(conc["params"]["agents"])
        top = {r["mode"]: r for r in conc["rows"] if r["agents"] == most}
        if "grpc_connect" in top and "ws_cache" in top:
            g, w = top["grpc_connect"], top["ws_cache"]
            targets.append(
                _target(
                    "T7",
                    f"gRPC Connect server CPU per agent turn <= WebSocket mode's at {most} agents",
                    g["server_cpu_ms_per_turn"] / w["server_cpu_ms_per_turn"],
                    g["server_cpu_ms_per_turn"] <= w["server_cpu_ms_per_turn"],
                    f"{g['server_cpu_ms_per_turn']:.2f} vs {w['server_cpu_ms_per_turn']:.2f} ms",
                )
            )
            ratio = g["throughput_turns_s"] / w["throughput_turns_s"]
            targets.append(
                _target(
                    "T8",
                    f"throughput at {most} agents, 1 worker: gRPC Connect >= WebSocket mode",
                    ratio,
                    ratio >= 1.0,
                    f"{g['throughput_turns_s']:.1f} vs {w['throughput_turns_s']:.1f} turns/s",
                )
            )
    more = by_name.get("concurrency-workers2")
    if more and "grpc_connect" in top:
        most = max(more["params"]["agents"])
        two = {r["mode"]: r for r in more["rows"] if r["agents"] == most}
        if "grpc_connect" in two:
            one_t = top["grpc_connect"]["throughput_turns_s"]
            two_t = two["grpc_connect"]["throughput_turns_s"]
            ws = (
                f"; WebSocket {top['ws_cache']['throughput_turns_s']:.1f} -> "
                f"{two['ws_cache']['throughput_turns_s']:.1f}"
                if "ws_cache" in two and "ws_cache" in top
                else ""
            )
            targets.append(
                _target(
                    "T9",
                    f"--workers 2 >= 1.6x --workers 1 for gRPC Connect at {most} agents",
                    two_t / one_t,
                    two_t / one_t >= 1.6,
                    f"{two_t:.1f} vs {one_t:.1f} turns/s{ws}",
                )
            )
    if "grpc_connect" in head and "http_new" in head:
        full, connect = head["http_new"], head["grpc_connect"]
        engine = full["engine_s_per_rollout"]
        removable = full["e2e_median_s"] - engine
        removed = (full["e2e_median_s"] - connect["e2e_median_s"]) / removable
        targets.append(
            _target(
                "T10",
                "headline: gRPC Connect removes >= 90% of HTTP full history's API overhead, "
                "(e2e full - e2e Connect) / (e2e full - engine time)",
                removed,
                removed >= 0.90,
                f"({full['e2e_median_s']:.3f} - {connect['e2e_median_s']:.3f}) / "
                f"({full['e2e_median_s']:.3f} - {engine:.3f}) = {removed * 100:.1f}%",
            )
        )
    return targets


# -- output -------------------------------------------------------------------------------


class Report:
    """Summaries, targets and metadata of one run, with renderers."""

    def __init__(
        self, cells: Sequence[CellResult], config: CompareConfig, meta: dict[str, Any]
    ) -> None:
        self.cells = list(cells)
        self.config = config
        self.meta = meta
        self.summaries = summarize(self.cells)
        self.targets = evaluate_targets(self.summaries)

    def tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        """(title, header, rows) for every table, as text."""
        out = []
        for s in self.summaries:
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
        return out

    def text(self) -> str:
        """Every table and the targets, aligned for a terminal."""
        parts = []
        for title, header, rows in self.tables():
            parts.append(title)
            parts.append(_aligned(header, rows))
            parts.append("")
        parts.append("Targets")
        for t in self.targets:
            mark = "MET   " if t["met"] else "MISSED" if t["met"] is False else "n/a   "
            parts.append(f"  [{mark}] {t['id']}: {t['target']} -- {t['detail']}")
        return "\n".join(parts)

    def markdown(self) -> str:
        """The tables and targets as Markdown (a draft for docs/results.md)."""
        lines = [f"Command: `{self.meta.get('command', '')}`", ""]
        machine = self.meta.get("machine", {})
        lines.append(
            f"Machine: {machine.get('nproc')} vCPU, {machine.get('cpu_model')}, "
            f"Python {machine.get('python')}; "
            + ", ".join(f"{k} {v}" for k, v in (machine.get("versions") or {}).items() if v)
        )
        lines.append(f"Allocator: {self.meta.get('allocator')}")
        lines.append("")
        for title, header, rows in self.tables():
            lines.append(f"### {title}")
            lines.append("")
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "|".join("---" for _ in header) + "|")
            lines.extend("| " + " | ".join(row) + " |" for row in rows)
            lines.append("")
        lines.append("### Targets")
        lines.append("")
        for t in self.targets:
            mark = "met" if t["met"] else "**missed**" if t["met"] is False else "n/a"
            lines.append(f"- {t['id']} ({mark}): {t['target']}: {t['detail']}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        """Everything: metadata, configuration, summaries, targets, and the raw cells."""
        config = asdict(self.config)
        config["out_dir"] = str(self.config.out_dir)
        for key, value in list(config.items()):
            if (
                isinstance(value, list)
                and value
                and isinstance(value[0], dict)
                and "key" in value[0]
            ):
                config[key] = [m["key"] for m in value]
            elif isinstance(value, dict) and "key" in value:
                config[key] = value["key"]
        return {
            "meta": self.meta,
            "config": config,
            "summaries": self.summaries,
            "targets": self.targets,
            "cells": [asdict(c) for c in self.cells],
        }


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _kb(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value / 1024:.1f}"


def _rollout_table(s: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
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
        "ovh p50 ms",
        "ovh p99 ms",
        "API %",
        "TTFT p50 ms",
        "srv CPU ms/turn",
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
                _fmt(r["overhead_p50_ms"], 2),
                _fmt(r["overhead_p99_ms"], 2),
                _fmt(r["api_share"] * 100, 1),
                _fmt(r["ttft_p50_ms"], 1),
                _fmt(r["server_cpu_ms_per_turn"], 1),
                _fmt(r["client_cpu_ms_per_turn"], 1),
                _kb(r["bytes_up_per_turn"]),
                _kb(r["bytes_down_per_turn"]),
                _fmt(r["events_per_turn"], 0),
                _fmt(r.get("messages_per_turn"), 1) if r.get("messages_per_turn") else "-",
                _fmt(r["tokens_rendered_per_turn"], 0),
            ]
        )
    return title, header, rows


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


def network_projection(s: dict[str, Any]) -> list[dict[str, Any]]:
    """Measured bytes and round trips per turn, priced for each profile (added to e2e)."""
    out = []
    for r in s["rows"]:
        mode = MODES[r["mode"]]
        up, down = r.get("bytes_up_per_turn"), r.get("bytes_down_per_turn")
        if up is None or down is None:
            continue
        rtts, connections = _round_trips(mode, r["turns_per_rollout"])
        row: dict[str, Any] = {
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


def _network_table(s: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
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
    return title, header, rows


def _history_table(s: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    p = s["params"]
    sizes = p["sizes"]
    title = (
        f"history sweep: median API overhead per turn (ms) of {p['small_turns']} small "
        f"turns ({p['small_tokens']}-token tool outputs) on a prefilled history, "
        f"{p['repeats']} repeat(s); last column: growth largest/smallest"
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
                    _fmt(mine[size]["overhead_p50_ms"], 2) if size in mine else "-"
                    for size in sizes
                ],
                _fmt(s["growth"].get(key), 2),
                _fmt(top.get("tokens_rendered_per_turn"), 0),
                _fmt(top.get("server_cpu_ms_per_turn"), 1),
            ]
        )
    return title, header, rows


def _concurrency_table(s: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
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
        f"spread over {p['processes']} client processes; p50 overhead ms in brackets"
    )
    header = [
        "#",
        "mode",
        *[f"{n} agents" for n in agents],
        "srv CPU ms/turn @max",
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
                    f"{mine[n]['throughput_turns_s']:.1f} ({mine[n]['overhead_p50_ms']:.1f})"
                    if n in mine
                    else "-"
                    for n in agents
                ],
                _fmt(top.get("server_cpu_ms_per_turn"), 1),
                _fmt(top.get("client_cpu_ms_per_turn"), 1),
            ]
        )
    return title, header, rows


def _pre_table(s: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
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
    return title, header, rows


def _breakdown_table(s: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
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
                _fmt(r["overhead_p50_ms"], 2),
                _fmt(r["api_pre_p50_ms"], 2),
                _fmt(r["api_post_p50_ms"], 2),
                _fmt(r["outside_p50_ms"], 2),
                _fmt(r["ttft_p50_ms"], 1),
                _fmt(r["events_per_turn"], 0),
                _kb(r["bytes_up_per_turn"]),
                _kb(r["bytes_down_per_turn"]),
                _fmt(r["server_cpu_ms_per_turn"], 1),
                _fmt(r["client_cpu_ms_per_turn"], 1),
            ]
        )
    return title, header, rows


def _keepup_table(s: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
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
    return title, header, rows


def _aligned(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


# -- files --------------------------------------------------------------------------------


def write_outputs(report: Report, out_dir: Path, *, plots: bool = True) -> dict[str, Path]:
    """results.json, turns.csv, runs.csv, summary.csv, report.md, report.txt and PNG plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    paths["json"] = out_dir / "results.json"
    paths["json"].write_text(
        json.dumps(report.to_json(), indent=1, default=_json_default), encoding="utf-8"
    )
    paths["turns_csv"] = out_dir / "turns.csv"
    _write_csv(paths["turns_csv"], [dict(t, cell=c.name) for c in report.cells for t in c.turns])
    paths["runs_csv"] = out_dir / "runs.csv"
    _write_csv(
        paths["runs_csv"],
        [
            {
                **{k: v for k, v in r.items() if not isinstance(v, list)},
                "e2e_s": ";".join(f"{x:.4f}" for x in r.get("e2e_s", [])),
                "cell": c.name,
            }
            for c in report.cells
            for r in c.runs
        ],
    )
    paths["summary_csv"] = out_dir / "summary.csv"
    _write_csv(
        paths["summary_csv"],
        [
            {"cell": s["name"], **{k: v for k, v in row.items() if not isinstance(v, list)}}
            for s in report.summaries
            for row in s["rows"]
        ],
    )
    paths["markdown"] = out_dir / "report.md"
    paths["markdown"].write_text(report.markdown(), encoding="utf-8")
    paths["text"] = out_dir / "report.txt"
    paths["text"].write_text(report.text() + "\n", encoding="utf-8")
    if plots:
        paths.update(write_plots(report, out_dir))
    return paths


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            for sub, inner in value.items():
                out[f"{key}.{sub}"] = inner
        else:
            out[key] = value
    return out


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    # Nested dicts (per-stage times) become one column per key.
    rows = [_flat(row) for row in rows]
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


_STYLE = {
    "http_new": ("tab:red", "--", "o"),
    "http_keepalive": ("tab:orange", "--", "s"),
    "http_store": ("tab:brown", "--", "^"),
    "ws_cache": ("tab:blue", "-", "o"),
    "ws_append": ("tab:cyan", "-", "s"),
    "grpc_create": ("tab:purple", ":", "D"),
    "grpc_connect": ("tab:green", "-", "o"),
    "grpc_append": ("tab:olive", "-", "s"),
}


def write_plots(report: Report, out_dir: Path) -> dict[str, Path]:
    """PNG plots (matplotlib, Agg backend): one per sweep that ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: dict[str, Path] = {}
    by_name = {s["name"]: s for s in report.summaries}

    def style(key: str) -> dict[str, Any]:
        color, line, marker = _STYLE.get(key, ("black", "-", "o"))
        return {
            "color": color,
            "linestyle": line,
            "marker": marker,
            "label": f"{MODES[key].number} {MODES[key].label}",
        }

    hist = by_name.get("history")
    if hist:
        fig, ax = plt.subplots(figsize=(8, 5))
        for key in hist["params"]["modes"]:
            rows = sorted(
                (r for r in hist["rows"] if r["mode"] == key), key=lambda r: r["history_target"]
            )
            if rows:
                ax.plot(
                    [r["history_tokens_mean"] / 1000 for r in rows],
                    [r["overhead_p50_ms"] for r in rows],
                    **style(key),
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("history length (thousand tokens)")
        ax.set_ylabel("API overhead per turn, median (ms)")
        ax.set_title("Per-turn API overhead vs history length (small turns)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths["plot_history"] = out_dir / "overhead_vs_history.png"
        fig.savefig(paths["plot_history"], dpi=110)
        plt.close(fig)

    tps_cells = sorted(
        (s for s in report.summaries if s["kind"] == "rollout" and s["name"].startswith("tps-")),
        key=lambda s: s["params"]["tokens_per_second"],
    )
    if tps_cells:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5))
        keys = list(dict.fromkeys(r["mode"] for s in tps_cells for r in s["rows"]))
        for key in keys:
            points = [
                (s["params"]["tokens_per_second"], r)
                for s in tps_cells
                for r in s["rows"]
                if r["mode"] == key
            ]
            xs = [p[0] for p in points]
            ys = [p[1]["e2e_median_s"] for p in points]
            err = [
                [y - p[1]["e2e_min_s"] for y, p in zip(ys, points, strict=True)],
                [p[1]["e2e_max_s"] - y for y, p in zip(ys, points, strict=True)],
            ]
            ax.errorbar(xs, ys, yerr=err, capsize=3, **style(key))
            rel = [(p[0], p[1].get("speedup_vs_http_new")) for p in points]
            rel = [(x, y) for x, y in rel if y is not None]
            if rel:
                ax2.plot([x for x, _ in rel], [y for _, y in rel], **style(key))
        for axis in (ax, ax2):
            axis.set_xscale("log")
            axis.set_xlabel("engine decode rate (tokens/s)")
            axis.grid(True, which="both", alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("end-to-end rollout time (s), median, min-max")
        ax.set_title("End to end vs tokens/s")
        ax2.set_ylabel("speedup over mode 1 (HTTP, full history, new conn)")
        ax2.set_title("Speedup vs tokens/s")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths["plot_tps"] = out_dir / "e2e_vs_tps.png"
        fig.savefig(paths["plot_tps"], dpi=110)
        plt.close(fig)

    concs = [s for s in report.summaries if s["kind"] == "concurrency"]
    if concs:
        fig, ax = plt.subplots(figsize=(8, 5))
        for conc in concs:
            window = conc["params"].get("delta_window_ms") or 0.0
            for key in conc["params"]["modes"]:
                rows = sorted(
                    (r for r in conc["rows"] if r["mode"] == key), key=lambda r: r["agents"]
                )
                if not rows:
                    continue
                kwargs = style(key)
                if window != DEFAULT_DELTA_WINDOW_MS:
                    kwargs["label"] += f" (delta window {window:g} ms, not the default)"
                    kwargs["linestyle"] = "-."
                    kwargs["marker"] = "x"
                ax.plot(
                    [r["agents"] for r in rows],
                    [r["throughput_turns_s"] for r in rows],
                    **kwargs,
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent agents")
        ax.set_ylabel("throughput (turns/s, median)")
        ax.set_title("Throughput vs concurrency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths["plot_concurrency"] = out_dir / "throughput_vs_concurrency.png"
        fig.savefig(paths["plot_concurrency"], dpi=110)
        plt.close(fig)

    head = by_name.get("headline")
    if head and head["rows"]:
        fig, ax = plt.subplots(figsize=(9, 5))
        rows = head["rows"]
        names = [f"{r['number']}" for r in rows]
        e2e = [r["e2e_median_s"] for r in rows]
        share = [r["api_share"] for r in rows]
        colors = [_STYLE.get(r["mode"], ("gray",))[0] for r in rows]
        bars = ax.bar(names, e2e, color=colors)
        for bar, s in zip(bars, share, strict=True):
            ax.annotate(
                f"API {s * 100:.0f}%",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_ylabel("end-to-end rollout time (s), median")
        ax.set_title("Headline rollout per mode (labels: API share of turn time)")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([f"{r['number']}\n{r['mode']}" for r in rows], fontsize=7)
        fig.tight_layout()
        paths["plot_headline"] = out_dir / "headline.png"
        fig.savefig(paths["plot_headline"], dpi=110)
        plt.close(fig)

    keep = by_name.get("keepup")
    if keep and keep["rows"]:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        labels = [
            f"{r['mode']}\n{r['policy'].replace(' (default)', chr(10) + '(default)')}"
            for r in keep["rows"]
        ]
        values = [r["server_core_share"] * 100 for r in keep["rows"]]
        colors = [_STYLE.get(r["mode"], ("gray",))[0] for r in keep["rows"]]
        bars = ax.bar(range(len(values)), values, color=colors)
        for bar, r in zip(bars, keep["rows"], strict=True):
            ax.annotate(
                f"{r['delivery'] * 100:.0f}% rate",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.axhline(25, color="gray", linestyle=":", label="target: 25% of a core")
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("server CPU (% of one core)")
        ax.set_title(
            f"One stream at {keep['params']['tokens_per_second']:g} tok/s "
            "(labels: delivered/engine rate)"
        )
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths["plot_keepup"] = out_dir / "keepup.png"
        fig.savefig(paths["plot_keepup"], dpi=110)
        plt.close(fig)
    return paths


def build_report(
    cells: Sequence[CellResult], config: CompareConfig, meta: dict[str, Any]
) -> Report:
    """A Report over ``cells``."""
    return Report(cells, config, meta)
