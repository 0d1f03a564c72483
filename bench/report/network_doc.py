"""docs/results-network.md: the network sweep's own document (``make compare-network``).

The prose is ``TEMPLATE`` below, its ``{{name}}`` placeholders filled from one run, as
``results_template.md`` is for ``make compare``; a figure the run lacks reads "n/a".
"""

from __future__ import annotations

from collections.abc import Callable

from .assembly import Report
from .records import JSONObject
from .tables import summary_tables

__all__ = ["TEMPLATE", "network_figures", "network_only"]

TEMPLATE = """\
# Results under deployed conditions: a network, TLS and the mesh's proxy

<!-- Written by `make compare-network` (bench/report/network_doc.py filled in with one run's
figures). Edit the template, not this file. -->

Everything here comes from one run of `make compare-network`; ratios are between modes at
the same link in the same run. **median [min-max over repeats]** unless a table says
otherwise. The loopback comparison (engine, rollout, modes, figures) is
[results.md](results.md); this document measures the same rollout where users deploy it.

## Setup

| | |
|---|---|
| command | `{{run.command}}` |
| run | {{run.started}}, {{run.duration_s}} s wall; commit `{{run.commit}}` |
| machine | {{machine.nproc}} vCPU (`{{machine.cpu}}`), Linux {{machine.kernel}}; {{net.shared}} |
| software | Python {{machine.python}}, {{machine.versions}} |
| engine | {{run.engine}} |
| link | {{net.link}} |
| TLS | {{net.tls}} |
| mesh | {{net.mesh}} |
| rollout | {{net.rollout}} |

**What the emulation does not model.** TCP's own congestion control: the relay's sockets are
loopback TCP, whose window is open from the first byte, so slow start on a new connection
(which would cost a new-connection-per-turn client several more round trips for a 400 KB
upload) and window growth after idle are absent, and HTTP/2's and TCP's flow-control windows
meet a bounded relay buffer instead of a real path's bandwidth-delay product. Loss,
retransmission, reordering and jitter: none. The relay releases bytes at most ~1 ms late
(asyncio timers). So the figures are a lower bound for what a lossy or congested path costs,
and they flatter the modes that open connections (mode 1) the most.

## End to end through the link

{{table.link}}

![end to end against RTT](results-network/network_e2e.png)

![speedup against RTT](results-network/network_speedup.png)

**From what distance the stateful designs pay off.** The round-trip time from which each is
1.40x faster end to end than HTTP with full history and a new connection per turn
(interpolated between the measured RTTs; "not reached" when no measured RTT gets there):

{{net.crossover}}

## Many agents on one link

{{net.multiplex}}

## Large tool outputs across a long link

{{net.large}}

## A real engine: llama.cpp

{{net.llama}}

## Through the mesh's proxy

{{net.envoy}}

![direct and through Envoy](results-network/network_envoy.png)

## Targets

{{table.targets}}

## What this run does not measure

- A lossy or congested path (see above), and TLS session resumption (every new connection
  here makes a full TLS 1.3 handshake, as a client without a session cache does).
"""


def network_only(report: Report) -> bool:
    """Whether the run measured the network sweep and nothing else."""
    kinds = {s["kind"] for s in report.summaries}
    return kinds == {"network"}


def _rate(mbit: float) -> str:
    return f"{mbit:g} Mbit/s" if mbit else "unlimited"


def network_figures(report: Report) -> dict[str, str]:
    """The network document's placeholders (beside the run's own, from ``figures``)."""
    net: JSONObject | None = next((s for s in report.summaries if s["kind"] == "network"), None)
    out: dict[str, str] = {}
    tables = [t for t in summary_tables(report.summaries) if t.title.startswith("network:")]
    out["table.link"] = (
        "\n\n".join(_markdown_table(t.title, t.header, t.rows) for t in tables)
        or "*(not run in this run)*"
    )
    if net is None:
        for key in (
            "net.tls",
            "net.rollout",
            "net.crossover",
            "net.envoy",
            "net.shared",
            "net.link",
            "net.mesh",
            "net.multiplex",
            "net.large",
            "net.llama",
        ):
            out[key] = "n/a"
        return out
    params = net["params"]
    load = report.meta.get("load_average") or {}
    out["net.shared"] = (
        f"**shared** with other work (load average {load.get('start', 'n/a')} at the start, "
        f"{load.get('end', 'n/a')} at the end)"
    )
    out["net.link"] = (
        "a relay process (`bench/netem.py`) between the clients and the server: each "
        "direction delayed by RTT/2 and paced to the rate (each direction its own link, "
        "shared by the connections through it), a new connection's first bytes held one extra "
        "round trip (its TCP handshake); the server-to-engine link stays loopback"
    )
    out["net.mesh"] = (
        "the project's Envoy (`cluster/envoy.py`, one worker thread) between the relay and a "
        "second server: TLS ends at Envoy, which proxies over loopback (HTTP/2 for gRPC, "
        "HTTP/1.1 with upgrades for WebSocket mode and HTTP)"
    )
    out["net.tls"] = (
        "every transport over TLS 1.3, certificates (ECDSA P-256, a CA and a loopback server "
        "certificate) made at run time; clients check the server's against the CA"
        if params.get("tls")
        else "off (plain TCP)"
    )
    workload = params.get("workload") or {}
    out["net.rollout"] = (
        f"the headline rollout: {workload.get('tool_turns', '?')} tool turns of "
        f"~{workload.get('tool_output_tokens', '?')}-token outputs at "
        f"{params['tokens_per_second']:g} tok/s, {params['repeats']} repeats per mode and "
        f"link, modes {', '.join(params['modes'])}; RTTs "
        f"{', '.join(f'{r:g}' for r in params['rtts_ms'])} ms x rates "
        f"{', '.join(_rate(m) for m in params['mbits'])}"
    )
    lines = ["| rate | Connect | WebSocket mode |", "|---|---|---|"]
    crossover = net.get("crossover_1_40") or {}
    for mbit in params["mbits"]:
        cells = []
        for key in ("grpc_connect", "ws_cache"):
            value = crossover.get(f"{key}@{mbit:g}")
            cells.append(f"{value:.1f} ms" if isinstance(value, int | float) else "not reached")
        lines.append(f"| {_rate(mbit)} | {cells[0]} | {cells[1]} |")
    out["net.crossover"] = "\n".join(lines)
    out["net.multiplex"] = _multiplex(net)
    out["net.large"] = _large(net)
    out["net.llama"] = _llama(net)
    envoy = [r for r in net["rows"] if r.get("path") == "envoy"]
    if envoy:
        direct = {
            (r["mode"], r["rtt_ms"], r["mbit"]): r
            for r in net["rows"]
            if r.get("path", "direct") == "direct"
        }
        rows = [
            "| link | mode | direct e2e s | through Envoy e2e s | Envoy/direct | Envoy CPU "
            "ms/turn | server CPU ms/turn (direct / Envoy) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in envoy:
            d = direct.get((r["mode"], r["rtt_ms"], r["mbit"]))
            ratio = f"{r['e2e_median_s'] / d['e2e_median_s']:.3f}x" if d else "n/a"
            proxy = r.get("proxy_cpu_ms_per_turn")
            cells = [
                f"{r['rtt_ms']:g} ms, {_rate(r['mbit'])}",
                f"{r['number']} {r['label']}",
                _e2e(d) if d else "n/a",
                _e2e(r),
                ratio,
                f"{proxy:.2f}" if proxy is not None else "n/a",
                (f"{d['server_cpu_ms_per_turn']:.1f}" if d else "n/a")
                + f" / {r['server_cpu_ms_per_turn']:.1f}",
            ]
            rows.append("| " + " | ".join(cells) + " |")
        out["net.envoy"] = "\n".join(rows)
    else:
        out["net.envoy"] = "*(no mesh link in this run)*"
    return out


def _multiplex(net: JSONObject) -> str:
    """Many agents on one link: Connect's on one channel against WebSocket mode's connection
    each; then each mode's agents on one connection, a lane each."""
    params = net["params"]
    workload = params.get("multiplex_workload") or {}
    agents = params.get("multiplex_agents", "?")
    intro = (
        f"{agents} agents at once in one client process, each running "
        f"{workload.get('tool_turns', '?')} tool turns of "
        f"~{workload.get('tool_output_tokens', '?')}-token outputs; every agent shares the "
        "link's rate. A rollout's end to end is per agent (median over agents and repeats)."
    )
    apart = _agents_table(
        net,
        "multiplex",
        "**An agent per stream or connection.** Connect's agents share one gRPC channel (one "
        "HTTP/2 connection: its flow-control windows and one TCP stream), each on its own "
        "stream; WebSocket mode's have a connection each.",
    )
    lanes = _agents_table(
        net,
        "lanes",
        "**An agent per lane of one connection.** Each mode's agents share one connection, "
        "each on its own lane (`stream_id`): one Connect stream, against one WebSocket "
        "connection whose lanes' events interleave in one TCP stream.",
    )
    if apart is None and lanes is None:
        return "*(no multiplexed link in this run)*"
    return "\n\n".join(part for part in (intro, apart, lanes) if part)


def _server_cpu(row: JSONObject) -> str:
    return f"{row['server_cpu_ms_per_turn']:.2f}"


def _kb_up(row: JSONObject) -> str:
    return f"{(row.get('bytes_up_per_turn') or 0) / 1024:.0f}"


def _agents_table(net: JSONObject, path: str, intro: str) -> str | None:
    return _connect_vs_websocket(net, path, intro, "server CPU ms/turn", _server_cpu)


def _connect_vs_websocket(
    net: JSONObject, path: str, intro: str, figure: str, value: Callable[[JSONObject], str]
) -> str | None:
    """Connect against WebSocket mode at each of ``path``'s links (None: none measured): end
    to end, overhead and ``figure`` (each mode's ``value``)."""
    rows = [r for r in net["rows"] if r.get("path") == path]
    if not rows:
        return None
    lines = [
        intro,
        "",
        "| link | Connect e2e s | WebSocket e2e s | Connect/WebSocket | overhead p50 ms "
        f"(Connect / WebSocket) | {figure} (Connect / WebSocket) |",
        "|---|---|---|---|---|---|",
    ]
    for rtt, mbit in net["params"].get(path) or []:
        here = {r["mode"]: r for r in rows if r["rtt_ms"] == rtt and r["mbit"] == mbit}
        g, w = here.get("grpc_connect"), here.get("ws_cache")
        if not g or not w:
            continue
        lines.append(
            f"| {rtt:g} ms, {_rate(mbit)} | {_e2e(g)} | {_e2e(w)} | "
            f"{g['e2e_median_s'] / w['e2e_median_s']:.3f}x | "
            f"{g['overhead_p50_ms']:.1f} / {w['overhead_p50_ms']:.1f} | "
            f"{value(g)} / {value(w)} |"
        )
    return "\n".join(lines)


def _large(net: JSONObject) -> str:
    """Connect against WebSocket mode when each turn uploads a large tool output."""
    workload = net["params"].get("large_workload") or {}
    intro = (
        f"{workload.get('tool_turns', '?')} tool turns of "
        f"~{workload.get('tool_output_tokens', '?')}-token outputs (each turn's upload is "
        "several times HTTP/2's initial 64 KiB flow-control window; gRPC grows the window by "
        "probing the bandwidth-delay product, a WebSocket frame is held back only by TCP, whose "
        "own window growth the emulation leaves out, so this favours WebSocket mode)."
    )
    table = _connect_vs_websocket(net, "large", intro, "KB up/turn", _kb_up)
    return table or "*(no large-output link in this run)*"


def _llama(net: JSONObject) -> str:
    """Every mode's rollout with llama.cpp as the engine, per link."""
    params = net["params"]
    rows = [r for r in net["rows"] if r.get("path") == "llama"]
    if not rows:
        return "*(no llama.cpp link in this run)*"
    workload = params.get("llama_workload") or {}
    lines = [
        "The engine is llama.cpp's own server (the tiny generated model: a real `llama` GGUF "
        "over the o200k/Harmony vocabulary, one slot and one thread, in its own process), "
        "reached through the production `completions` route in the Harmony format: the server "
        "renders each turn to token ids, streams the model's sampled ids back and parses them "
        f"into items. {workload.get('tool_turns', '?')} tool turns of "
        f"~{workload.get('tool_output_tokens', '?')}-token outputs (the model's context is "
        "8192 tokens), the first tool forced each turn so that every mode runs the same turns. "
        "llama.cpp keeps its own prefix (KV) cache, so HTTP with full history re-sends the "
        "history but llama.cpp does not recompute it; the server still re-parses and re-renders "
        "it. The engine's CPU is llama.cpp's process.",
        "",
        "| link | # | mode | e2e s | speedup | overhead p50 ms | server CPU ms/turn | "
        "llama.cpp CPU ms/turn | KB up/turn |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        speedup = r.get("speedup_vs_http_new")
        engine = r.get("engine_cpu_ms_per_turn")
        up = r.get("bytes_up_per_turn")
        lines.append(
            f"| {r['rtt_ms']:g} ms, {_rate(r['mbit'])} | {r['number']} | {r['label']} | "
            f"{_e2e(r)} | {f'{speedup:.2f}x' if speedup else '-'} | "
            f"{r['overhead_p50_ms']:.1f} | {r['server_cpu_ms_per_turn']:.1f} | "
            f"{f'{engine:.1f}' if engine is not None else '-'} | "
            f"{f'{up / 1024:.1f}' if up is not None else '-'} |"
        )
    return "\n".join(lines)


def _e2e(row: JSONObject) -> str:
    return f"{row['e2e_median_s']:.2f} ({row['e2e_min_s']:.2f}-{row['e2e_max_s']:.2f})"


def _markdown_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    lines = [f"*{title}*", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)
