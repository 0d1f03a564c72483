"""The targets of the comparison, judged on one run's summaries (met, missed or not run)."""

from __future__ import annotations

from collections.abc import Sequence

from ..clients import MODES
from ..run import DEFAULT_DELTA_WINDOW_MS
from .records import JSONObject, Target

__all__ = ["evaluate_targets"]


def _target(tid: str, text: str, measured: float | None, met: bool | None, detail: str) -> Target:
    return {"id": tid, "target": text, "measured": measured, "met": met, "detail": detail}


def evaluate_targets(summaries: Sequence[JSONObject]) -> list[Target]:
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
    targets += _steering_targets(by_name)
    targets += _per_turn_cost_targets(by_name, rows)
    targets += _deployed_targets(by_name, rows)
    return targets


def _out_of_process(summary: JSONObject) -> bool:
    """Whether the cell's engine ran in its own process (its CPU not in the server's)."""
    server = summary["params"].get("server") or {}
    return bool(server.get("sim_backend_url"))


def _deployed_targets(by_name: dict[str, JSONObject], head: dict[str, JSONObject]) -> list[Target]:
    """The comparison under deployed conditions: a network with TLS, the engine apart."""
    out: list[Target] = []
    net = by_name.get("network")
    if net:
        tls = "TLS" if net["params"].get("tls") else "plain TCP"
        direct = [r for r in net["rows"] if r.get("path", "direct") == "direct"]
        at = {r["mode"]: r for r in direct if r["rtt_ms"] == 20 and not r["mbit"]}
        if "grpc_connect" in at and "http_new" in at:
            g, h = at["grpc_connect"], at["http_new"]
            speedup = h["e2e_median_s"] / g["e2e_median_s"]
            out.append(
                _target(
                    "N1",
                    f"at 20 ms RTT ({tls}, unlimited rate) Connect >= 1.40x faster end to end "
                    "than HTTP full history with a new connection per turn",
                    speedup,
                    speedup >= 1.40,
                    f"{g['e2e_median_s']:.2f} s vs {h['e2e_median_s']:.2f} s: {speedup:.2f}x",
                )
            )
        worst: tuple[float, str, str] | None = None
        slower: list[str] = []
        for rtt in net["params"]["rtts_ms"]:
            for mbit in net["params"]["mbits"]:
                here = {r["mode"]: r for r in direct if r["rtt_ms"] == rtt and r["mbit"] == mbit}
                if "grpc_connect" not in here or "ws_cache" not in here:
                    continue
                g, w = here["grpc_connect"], here["ws_cache"]
                ratio = g["e2e_median_s"] / w["e2e_median_s"]
                label = f"{rtt:g} ms/{f'{mbit:g} Mbit/s' if mbit else 'unlimited'}"
                if worst is None or ratio > worst[0]:
                    # The client's own CPU is on the turn's path too (the gRPC library's).
                    clients = (
                        f"client CPU per turn there: Connect {g['client_cpu_ms_per_turn']:.2f} "
                        f"vs WebSocket {w['client_cpu_ms_per_turn']:.2f} ms"
                    )
                    worst = (ratio, label, clients)
                # Within the spread: Connect's median no slower than WebSocket's slowest repeat.
                if g["e2e_median_s"] > w["e2e_max_s"]:
                    slower.append(f"{label} ({ratio:.3f}x)")
        if worst is not None:
            out.append(
                _target(
                    "N2",
                    f"Connect no slower end to end than WebSocket mode at any link ({tls}; "
                    "Connect's median within WebSocket's slowest repeat)",
                    worst[0],
                    not slower,
                    f"worst Connect/WebSocket ratio {worst[0]:.3f}x at {worst[1]} ({worst[2]})"
                    + (f"; slower beyond the spread at {', '.join(slower)}" if slower else ""),
                )
            )
    headline = by_name.get("headline")
    if headline and _out_of_process(headline):
        connect, ws = head.get("grpc_connect"), head.get("ws_cache")
        if connect and ws and ws["server_cpu_ms_per_turn"]:
            ratio = connect["server_cpu_ms_per_turn"] / ws["server_cpu_ms_per_turn"]
            out.append(
                _target(
                    "N3",
                    "engine in its own process: the API server's CPU per headline turn, "
                    "Connect <= 1.10x WebSocket mode's",
                    ratio,
                    ratio <= 1.10,
                    f"{connect['server_cpu_ms_per_turn']:.2f} vs "
                    f"{ws['server_cpu_ms_per_turn']:.2f} ms: {ratio:.2f}x",
                )
            )
    conc = by_name.get("concurrency")
    if conc and _out_of_process(conc):
        most = conc["params"]["agents"][-1]
        top = {r["mode"]: r for r in conc["rows"] if r["agents"] == most}
        c, w = top.get("grpc_connect"), top.get("ws_cache")
        if c and w and w["server_cpu_ms_per_turn"]:
            ratio = c["server_cpu_ms_per_turn"] / w["server_cpu_ms_per_turn"]
            out.append(
                _target(
                    "N4",
                    f"engine in its own process: the API server's CPU per turn at {most} "
                    "agents, Connect <= 1.10x WebSocket mode's",
                    ratio,
                    ratio <= 1.10,
                    f"{c['server_cpu_ms_per_turn']:.2f} vs {w['server_cpu_ms_per_turn']:.2f} "
                    f"ms: {ratio:.2f}x",
                )
            )
    return out


def _per_turn_cost_targets(
    by_name: dict[str, JSONObject], head: dict[str, JSONObject]
) -> list[Target]:
    """Connect's own per-turn costs against WebSocket mode's (medians, same run)."""
    out: list[Target] = []
    connect, ws = head.get("grpc_connect"), head.get("ws_cache")
    if connect and ws and ws["server_cpu_ms_per_turn"]:
        ratio = connect["server_cpu_ms_per_turn"] / ws["server_cpu_ms_per_turn"]
        out.append(
            _target(
                "T12",
                "server CPU per headline turn, Connect with the project's client <= 1.00x "
                "WebSocket mode's",
                ratio,
                ratio <= 1.00,
                f"{connect['server_cpu_ms_per_turn']:.2f} vs {ws['server_cpu_ms_per_turn']:.2f} "
                f"ms: {ratio:.2f}x",
            )
        )
    conc = by_name.get("concurrency")
    if conc:
        most = conc["params"]["agents"][-1]
        top = {r["mode"]: r for r in conc["rows"] if r["agents"] == most}
        if (
            "grpc_connect" in top
            and "ws_cache" in top
            and top["ws_cache"]["server_cpu_ms_per_turn"]
        ):
            c, w = top["grpc_connect"], top["ws_cache"]
            ratio = c["server_cpu_ms_per_turn"] / w["server_cpu_ms_per_turn"]
            out.append(
                _target(
                    "T13",
                    f"server CPU per turn at {most} agents, Connect <= 1.10x WebSocket mode's",
                    ratio,
                    ratio <= 1.10,
                    f"{c['server_cpu_ms_per_turn']:.2f} vs {w['server_cpu_ms_per_turn']:.2f} ms: "
                    f"{ratio:.2f}x; {c['throughput_turns_s']:.0f} vs "
                    f"{w['throughput_turns_s']:.0f} turns/s",
                )
            )
    hist = by_name.get("history")
    if hist:
        size = hist["params"]["sizes"][0]
        small = {r["mode"]: r for r in hist["rows"] if r["history_target"] == size}
        if "grpc_connect" in small and "ws_cache" in small:
            c, w = small["grpc_connect"]["overhead_p50_ms"], small["ws_cache"]["overhead_p50_ms"]
            out.append(
                _target(
                    "T14",
                    f"small-turn overhead at {size // 1000}k history, Connect <= WebSocket mode",
                    c / w if w else None,
                    c <= w,
                    f"{c:.2f} vs {w:.2f} ms",
                )
            )
    if connect and ws and connect.get("messages_per_turn") and ws.get("messages_per_turn"):
        ratio = connect["messages_per_turn"] / ws["messages_per_turn"]
        out.append(
            _target(
                "T15",
                "wire messages per headline turn, Connect <= half of WebSocket mode's frames",
                ratio,
                ratio <= 0.5,
                f"{connect['messages_per_turn']:.1f} vs {ws['messages_per_turn']:.1f}: "
                f"{ratio:.2f}x",
            )
        )
    return out


def _steering_targets(by_name: dict[str, JSONObject]) -> list[Target]:
    """Steer -> the successor's first token: Connect no slower than WebSocket mode (T11)."""
    steer = by_name.get("steer")
    steering = {r["mode"]: r for r in steer["rows"]} if steer else {}
    if "grpc_connect" not in steering or "ws_cache" not in steering:
        return []
    g, w = steering["grpc_connect"], steering["ws_cache"]
    g_first, w_first = g["successor_first_token_p50_ms"], w["successor_first_token_p50_ms"]
    return [
        _target(
            "T11",
            "steering: steer -> successor's first token on gRPC Connect <= WebSocket mode's, "
            "at p50, same run",
            g_first / w_first,
            g_first <= w_first,
            f"{g_first:.2f} vs {w_first:.2f} ms (acknowledgement {g['ack_p50_ms']:.2f} vs "
            f"{w['ack_p50_ms']:.2f} ms)",
        )
    ]


def _issue11_targets(by_name: dict[str, JSONObject], head: dict[str, JSONObject]) -> list[Target]:
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
    top: dict[str, JSONObject] = {}
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
