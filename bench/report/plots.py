"""PNG plots of the sweeps (matplotlib, Agg backend), one per sweep that ran."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ..clients import MODES
from ..run import DEFAULT_DELTA_WINDOW_MS
from .assembly import Report
from .records import JSONObject

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["write_plots"]

Panel = tuple[str, list[JSONObject]]


def _cpu_panels(report: Report) -> list[Panel]:
    """(title, rows) of server CPU per turn: headline, small turns, the most agents."""
    by_name = {s["name"]: s for s in report.summaries}
    panels: list[Panel] = []
    head = by_name.get("headline")
    if head and head["rows"]:
        panels.append(("headline turns (1,000 tok/s, 4k-token tool outputs)", head["rows"]))
    hist = by_name.get("history")
    if hist and hist["rows"]:
        size = hist["params"]["sizes"][0]
        rows = [r for r in hist["rows"] if r["history_target"] == size]
        panels.append((f"small turns at {size // 1000}k history", rows))
    conc = by_name.get("concurrency")
    if conc and conc["rows"]:
        most = conc["params"]["agents"][-1]
        rows = [r for r in conc["rows"] if r["agents"] == most]
        panels.append((f"{most} concurrent agents (1 worker)", rows))
    return panels


class _LineStyle(TypedDict):
    """Keyword arguments of ``Axes.plot`` that tell one mode's line apart."""

    color: str
    linestyle: str
    marker: str
    label: str


_STYLE = {
    "http_new": ("tab:red", "--", "o"),
    "http_keepalive": ("tab:orange", "--", "s"),
    "http_store": ("tab:brown", "--", "^"),
    "ws_cache": ("tab:blue", "-", "o"),
    "ws_append": ("tab:cyan", "-", "s"),
    "grpc_create": ("tab:purple", ":", "D"),
    "grpc_connect": ("tab:green", "-", "o"),
    "grpc_append": ("tab:olive", "-", "s"),
    "grpc_single": ("tab:gray", "-.", "x"),
    "grpc_slim": ("tab:pink", "-", "^"),
    "ws_batched": ("navy", "-.", "v"),
}


def _line_chart(ax: Axes, *, x: str, y: str, title: str) -> None:
    """Axis labels, title, a light grid and the legend of one of the line charts."""
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def write_plots(report: Report, out_dir: Path) -> dict[str, Path]:
    """PNG plots (matplotlib, Agg backend): one per sweep that ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: dict[str, Path] = {}
    by_name = {s["name"]: s for s in report.summaries}

    def save(fig: Figure, name: str) -> Path:
        """Lay out, write ``name`` in the output directory, and free the figure."""
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    def style(key: str) -> _LineStyle:
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
        _line_chart(
            ax,
            x="history length (thousand tokens)",
            y="API overhead per turn, median (ms)",
            title="Per-turn API overhead vs history length (small turns)",
        )
        paths["plot_history"] = save(fig, "overhead_vs_history.png")

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
        paths["plot_tps"] = save(fig, "e2e_vs_tps.png")

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
        _line_chart(
            ax,
            x="concurrent agents",
            y="throughput (turns/s, median)",
            title="Throughput vs concurrency",
        )
        paths["plot_concurrency"] = save(fig, "throughput_vs_concurrency.png")

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
        paths["plot_headline"] = save(fig, "headline.png")

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
        paths["plot_keepup"] = save(fig, "keepup.png")

    panels = _cpu_panels(report)
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5), squeeze=False)
        for ax, (title, rows) in zip(axes[0], panels, strict=True):
            values = [r["server_cpu_ms_per_turn"] for r in rows]
            spans = [
                r.get("server_cpu_ms_per_turn_range") or [v, v]
                for r, v in zip(rows, values, strict=True)
            ]
            err = [
                [v - lo for v, (lo, _) in zip(values, spans, strict=True)],
                [hi - v for v, (_, hi) in zip(values, spans, strict=True)],
            ]
            colors = [_STYLE.get(r["mode"], ("gray",))[0] for r in rows]
            ax.bar(range(len(rows)), values, yerr=err, capsize=3, color=colors)
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels(
                [f"{r['number']} {r['mode']}" for r in rows], fontsize=7, rotation=45, ha="right"
            )
            ax.set_ylabel("ms per turn (median; bars: min-max over repeats)")
            ax.set_title(title, fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle("Server CPU per turn by mode (all threads of the server process)")
        paths["plot_cpu"] = save(fig, "server_cpu_per_turn.png")

    steer = by_name.get("steer")
    if steer and steer["rows"]:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
        rows = steer["rows"]
        for ax, key, what in (
            (axes[0], "ack_ms", "steer sent -> acknowledgement"),
            (axes[1], "successor_first_token_ms", "steer sent -> successor's first token"),
        ):
            data = [r[key] or [0.0] for r in rows]
            box = ax.boxplot(data, patch_artist=True, whis=(10, 90))
            for patch, r in zip(box["boxes"], rows, strict=True):
                patch.set_facecolor(_STYLE.get(r["mode"], ("gray",))[0])
                patch.set_alpha(0.6)
            ax.set_xticks(range(1, len(rows) + 1))
            ax.set_xticklabels([f"{r['number']}\n{r['mode']}" for r in rows], fontsize=8)
            ax.set_ylabel("ms (box: quartiles, whiskers: p10-p90)")
            ax.set_title(what, fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle(
            f"Steering per transport, same engine ({steer['params']['ttft_ms']:g} ms to a "
            "first token)"
        )
        paths["plot_steer"] = save(fig, "steering.png")

    net = by_name.get("network")
    if net and net["rows"]:
        paths.update(_network_plots(net, save, style))
    return paths


def _network_plots(
    net: JSONObject, save: Callable[[Figure, str], Path], style: Callable[[str], _LineStyle]
) -> dict[str, Path]:
    """The network sweep: end to end and speedup against RTT per rate; Envoy against direct."""
    import matplotlib.pyplot as plt

    paths: dict[str, Path] = {}
    direct = [r for r in net["rows"] if r.get("path", "direct") == "direct"]
    mbits = list(net["params"]["mbits"])
    modes = list(net["params"]["modes"])

    def rate(mbit: float) -> str:
        return f"{mbit:g} Mbit/s" if mbit else "unlimited rate"

    fig, axes = plt.subplots(1, len(mbits), figsize=(5 * len(mbits), 4.5), squeeze=False)
    for ax, mbit in zip(axes[0], mbits, strict=True):
        for key in modes:
            rows = sorted(
                (r for r in direct if r["mode"] == key and r["mbit"] == mbit),
                key=lambda r: r["rtt_ms"],
            )
            if rows:
                ax.errorbar(
                    [r["rtt_ms"] for r in rows],
                    [r["e2e_median_s"] for r in rows],
                    yerr=[
                        [r["e2e_median_s"] - r["e2e_min_s"] for r in rows],
                        [r["e2e_max_s"] - r["e2e_median_s"] for r in rows],
                    ],
                    capsize=3,
                    **style(key),
                )
        _line_chart(
            ax, x="round-trip time (ms)", y="rollout end to end, median (s)", title=rate(mbit)
        )
    fig.suptitle("The rollout through an emulated link (TLS): median, bars min-max")
    paths["plot_network_e2e"] = save(fig, "network_e2e.png")

    fig, ax = plt.subplots(figsize=(8, 5))
    for mbit, line in zip(mbits, ("-", "--", ":", "-."), strict=False):
        for key in ("grpc_connect", "ws_cache", "http_keepalive"):
            rows = sorted(
                (
                    r
                    for r in direct
                    if r["mode"] == key and r["mbit"] == mbit and "speedup_vs_http_new" in r
                ),
                key=lambda r: r["rtt_ms"],
            )
            if rows:
                kwargs = style(key)
                kwargs["linestyle"] = line
                kwargs["label"] = f"{kwargs['label']}, {rate(mbit)}"
                ax.plot(
                    [r["rtt_ms"] for r in rows],
                    [r["speedup_vs_http_new"] for r in rows],
                    **kwargs,
                )
    ax.axhline(1.40, color="grey", linewidth=1)
    _line_chart(
        ax,
        x="round-trip time (ms)",
        y="speedup vs HTTP full history, new connection per turn",
        title="End-to-end speedup against round-trip time (grey: 1.40x)",
    )
    paths["plot_network_speedup"] = save(fig, "network_speedup.png")

    mesh = [tuple(m) for m in net["params"].get("mesh") or []]
    envoy = [r for r in net["rows"] if r.get("path") == "envoy"]
    if mesh and envoy:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        keys = [k for k in modes if any(r["mode"] == k for r in envoy)]
        labels: list[str] = []
        width = 0.8 / (2 * len(keys))
        for i, (rtt, mbit) in enumerate(mesh):
            labels.append(f"{rtt:g} ms, {rate(mbit)}")
            for j, key in enumerate(keys):
                for k, (path, rows) in enumerate((("direct", direct), ("Envoy", envoy))):
                    row = next(
                        (
                            r
                            for r in rows
                            if r["mode"] == key and (r["rtt_ms"], r["mbit"]) == (rtt, mbit)
                        ),
                        None,
                    )
                    if row is None:
                        continue
                    x = i + (2 * j + k - len(keys) + 0.5) * width
                    color = style(key)["color"]
                    ax.bar(
                        x,
                        row["e2e_median_s"],
                        width,
                        yerr=[
                            [row["e2e_median_s"] - row["e2e_min_s"]],
                            [row["e2e_max_s"] - row["e2e_median_s"]],
                        ],
                        color=color,
                        alpha=1.0 if path == "direct" else 0.45,
                        label=f"{MODES[key].number} {MODES[key].label}, {path}" if i == 0 else None,
                    )
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylabel("rollout end to end, median (s)")
        ax.set_title("Direct to the server and through Envoy (pale), TLS")
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
        paths["plot_network_envoy"] = save(fig, "network_envoy.png")
    return paths
