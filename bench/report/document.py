"""docs/results.md as one document: the template's prose with this run's tables and figures.

The prose lives in ``results_template.md`` beside this module. ``{{name}}`` in it is replaced
by a figure or a table of the run (see ``figures``); a name the run has no data for reads
"n/a", and a name that is not defined at all is an error, so a typo never reaches the page.
Figures from separate benchmarks are static text in the template, marked as such.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from ..clients import MODES
from .assembly import Report
from .network_doc import TEMPLATE as NETWORK_TEMPLATE
from .network_doc import network_figures, network_only
from .peers import peers_section
from .records import JSONObject, JSONValue
from .table_cells import Table
from .tables import summary_tables

__all__ = ["PLACEHOLDER", "SECTIONS", "figures", "render_document", "write_document"]

#: A placeholder of the template: ``{{name}}``.
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_.\-]+)\s*\}\}")

#: The document's sections, in order (the smoke test checks each is there).
SECTIONS = (
    "Setup",
    "Headline",
    "Per-turn overhead against history",
    "Per-message costs and merging",
    "Keep-up: one fast stream",
    "End to end against tokens/s",
    "Concurrency and workers",
    "Steering",
    "Network projection, on paper",
    "Cross-check with aiperf",
    "Targets",
    "Reading: where each design wins, and why",
    "Measured context from separate benchmarks",
    "Caveats",
)

NA = "n/a"


def _num(value: JSONValue, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NA
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def _spread(value: JSONValue, low: JSONValue, high: JSONValue, digits: int, unit: str) -> str:
    """``value unit [low-high]``, the range left out when there is none."""
    text = _num(value, digits)
    if text == NA:
        return NA
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low != high:
        text += f" [{_num(low, digits)}-{_num(high, digits)}]"
    return f"{text} {unit}".rstrip()


def _markdown(table: Table, *, caption: bool = True) -> str:
    lines = [f"*{table.title}*", ""] if caption else []
    lines.append("| " + " | ".join(table.header) + " |")
    lines.append("|" + "|".join("---" for _ in table.header) + "|")
    lines.extend("| " + " | ".join(row) + " |" for row in table.rows)
    return "\n".join(lines)


#: Words in the titles of the tables that sit beside a rollout table.
_BESIDE = ("network projection ON PAPER", "pre-inference work")


def _tables(tables: Sequence[Table], *needles: str, start: str = "") -> str:
    """The tables whose title holds one of ``needles`` (or, with ``start``, the rollout tables
    whose title begins with it), as Markdown."""
    if start:
        chosen = [
            t
            for t in tables
            if t.title.startswith(start) and not any(b in t.title for b in _BESIDE)
        ]
    else:
        chosen = [t for t in tables if any(n in t.title for n in needles)]
    return "\n\n".join(_markdown(t) for t in chosen) if chosen else "*(not run in this run)*"


def _ratio(a: JSONValue, b: JSONValue) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return f"{a / b:.2f}x"
    return NA


def _rows(summary: JSONObject | None) -> dict[str, JSONObject]:
    return {r["mode"]: r for r in summary["rows"]} if summary else {}


def _targets_table(report: Report) -> str:
    if not report.targets:
        return "*(no target could be judged in this run)*"
    lines = ["| id | target | result | measured |", "|---|---|---|---|"]
    for t in report.targets:
        mark = "met" if t["met"] else "**missed**" if t["met"] is False else "n/a"
        lines.append(f"| {t['id']} | {t['target']} | {mark} | {t['detail']} |")
    return "\n".join(lines)


def _aiperf(aiperf: JSONObject | None, head: dict[str, JSONObject]) -> str:
    """The aiperf cross-check beside the project's own figures for the same workload."""
    if not aiperf:
        return (
            "*(aiperf was not run with this report: `make aiperf` runs it and writes "
            "`bench-out/aiperf.json`, which the next `make compare` or `make report` picks up)*"
        )
    if aiperf.get("error"):
        return f"*aiperf did not complete: {aiperf['error']}*"
    lines = [
        f"Workload: {aiperf.get('workload', '')}",
        "",
        f"Command: `{aiperf.get('command', '')}`",
        "",
        "| figure | aiperf | project's own client, same workload |",
        "|---|---|---|",
    ]
    for row in aiperf.get("rows", []):
        lines.append(f"| {row['figure']} | {row['aiperf']} | {row['own']} |")
    return "\n".join(lines)


def _per_message_us(rows: Sequence[JSONObject], mode: str) -> str:
    """Server CPU per delta message of ``mode`` in the keep-up rows: the CPU difference between
    merging off and the default window over the difference in delta events (one event per
    message for modes that do not batch)."""
    mine = {
        ("default" if "default" in r["policy"] else r["policy"]): r
        for r in rows
        if r["mode"] == mode
    }
    off, default = mine.get("off"), mine.get("default")
    if not off or not default:
        return NA
    messages = sum(off["deltas_per_response"]) - sum(default["deltas_per_response"])
    if messages <= 0:
        return NA
    cpu = off["server_cpu_s"] - default["server_cpu_s"]
    return f"{cpu / messages * 1e6:.0f} µs"


def figures(
    report: Report, aiperf: JSONObject | None = None, peers: JSONObject | None = None
) -> dict[str, str]:
    """Every name the template may use, with its text for this run."""
    by_name = {s["name"]: s for s in report.summaries}
    tables = summary_tables(report.summaries)
    meta = report.meta
    machine = meta.get("machine") or {}
    out: dict[str, str] = {}
    load = meta.get("load_average") or {}
    out["run.command"] = str(meta.get("command", NA))
    out["run.started"] = str(meta.get("started", NA))
    out["run.duration_s"] = _num(meta.get("duration_s"), 0)
    out["run.commit"] = str(machine.get("git_commit") or NA)
    out["run.load"] = (
        f"load average {load.get('start', NA)} at the start, {load.get('end', NA)} at the end"
        if load
        else "load average not recorded"
    )
    out["machine.nproc"] = str(machine.get("nproc", NA))
    out["machine.cpu"] = str(machine.get("cpu_model", NA))
    out["machine.memory_gib"] = str(machine.get("memory_gib", NA))
    out["machine.kernel"] = str(machine.get("kernel", NA))
    out["machine.python"] = str(machine.get("python", NA))
    out["machine.versions"] = ", ".join(
        f"{k} {v}" for k, v in (machine.get("versions") or {}).items() if v
    )
    out["run.allocator"] = str(meta.get("allocator", NA))
    out.update(_engine_texts(str(meta.get("engine", "inproc"))))
    out.update(network_figures(report))
    out["modes.table"] = "\n".join(
        ["| # | mode | transport | history |", "|---|---|---|---|"]
        + [f"| {m.number} | {m.label} | {m.transport} | {m.history} |" for m in MODES.values()]
    )
    out["table.headline"] = _tables(tables, start="headline: ")
    out["table.headline.pre"] = _tables(tables, "pre-inference work")
    out["table.network"] = _tables(tables, "network projection ON PAPER")
    out["table.history"] = _tables(tables, "history sweep")
    out["table.history.breakdown"] = _tables(tables, "where the API overhead goes")
    out["tables.tps"] = (
        "\n\n".join(_markdown(t) for t in tables if t.title.startswith("tps-"))
        or "*(not run in this run)*"
    )
    out["tables.concurrency"] = _tables(tables, "throughput in turns/s")
    out["table.keepup"] = _tables(tables, "keep-up:")
    out["table.steer"] = _tables(tables, "steering:")
    out["table.targets"] = _targets_table(report)

    head = _rows(by_name.get("headline"))
    for key in MODES:
        r = head.get(key, {})
        cpu_range = r.get("server_cpu_ms_per_turn_range") or [None, None]
        medians = r.get("overhead_repeat_medians_ms") or []
        out[f"h.{key}.e2e"] = _spread(
            r.get("e2e_median_s"), r.get("e2e_min_s"), r.get("e2e_max_s"), 3, "s"
        )
        out[f"h.{key}.cpu"] = _spread(
            r.get("server_cpu_ms_per_turn"), cpu_range[0], cpu_range[1], 1, "ms"
        )
        out[f"h.{key}.ovh"] = _spread(
            r.get("overhead_p50_ms"),
            min(medians) if len(medians) > 1 else None,
            max(medians) if len(medians) > 1 else None,
            2,
            "ms",
        )
        out[f"h.{key}.msgs"] = _num(r.get("messages_per_turn") or r.get("events_per_turn"), 1)
        out[f"h.{key}.events"] = _num(r.get("events_per_turn"), 1)
        out[f"h.{key}.down_kb"] = _num(
            (r["bytes_down_per_turn"] / 1024) if r.get("bytes_down_per_turn") else None, 1
        )
        out[f"h.{key}.speedup"] = (
            f"{r['speedup_vs_http_new']:.2f}x" if "speedup_vs_http_new" in r else NA
        )
        out[f"h.{key}.cli_cpu"] = _num(r.get("client_cpu_ms_per_turn"), 1)
        out[f"h.{key}.engine_s"] = _num(r.get("engine_s_per_rollout"), 2)
        out[f"h.{key}.tokens_rendered"] = _num(r.get("tokens_rendered_per_turn"), 0)
        out[f"h.{key}.ttft"] = _num(r.get("ttft_p50_ms"), 1)
    ws, connect = head.get("ws_cache", {}), head.get("grpc_connect", {})
    out["h.cpu_ratio"] = _ratio(
        connect.get("server_cpu_ms_per_turn"), ws.get("server_cpu_ms_per_turn")
    )
    out["h.e2e_ratio"] = _ratio(connect.get("e2e_median_s"), ws.get("e2e_median_s"))
    out["h.msgs_ratio"] = _ratio(
        connect.get("messages_per_turn"), ws.get("messages_per_turn") or ws.get("events_per_turn")
    )

    hist = by_name.get("history")
    sizes = hist["params"]["sizes"] if hist else []
    for key in MODES:
        mine = {r["history_target"]: r for r in hist["rows"] if r["mode"] == key} if hist else {}
        low = mine.get(sizes[0]) if sizes else None
        high = mine.get(sizes[-1]) if sizes else None
        out[f"hist.{key}.low"] = _num(low["overhead_p50_ms"] if low else None, 2)
        out[f"hist.{key}.high"] = _num(high["overhead_p50_ms"] if high else None, 2)
        out[f"hist.{key}.growth"] = _num(hist["growth"].get(key) if hist else None, 2)
        out[f"hist.{key}.cpu_low"] = _num(low["server_cpu_ms_per_turn"] if low else None, 1)
    out["hist.low"] = f"{sizes[0] // 1000}k" if sizes else NA
    out["hist.high"] = f"{sizes[-1] // 1000}k" if sizes else NA

    conc = by_name.get("concurrency")
    agents = conc["params"]["agents"] if conc else []
    out["conc.agents"] = str(agents[-1]) if agents else NA
    for name, prefix in (("concurrency", "conc"), ("concurrency-workers2", "conc2")):
        summary = by_name.get(name)
        for key in MODES:
            top = (
                next(
                    (
                        r
                        for r in summary["rows"]
                        if r["mode"] == key and r["agents"] == summary["params"]["agents"][-1]
                    ),
                    None,
                )
                if summary
                else None
            )
            rng = (top or {}).get("throughput_range") or [None, None]
            cpu = (top or {}).get("server_cpu_ms_per_turn_range") or [None, None]
            out[f"{prefix}.{key}.tps"] = _spread(
                top["throughput_turns_s"] if top else None, rng[0], rng[1], 1, "turns/s"
            )
            out[f"{prefix}.{key}.cpu"] = _spread(
                top["server_cpu_ms_per_turn"] if top else None, cpu[0], cpu[1], 2, "ms"
            )
    c1 = (
        {r["mode"]: r for r in conc["rows"] if r["agents"] == agents[-1]} if conc and agents else {}
    )
    out["conc.cpu_ratio"] = (
        _ratio(
            c1["grpc_connect"]["server_cpu_ms_per_turn"], c1["ws_cache"]["server_cpu_ms_per_turn"]
        )
        if c1 and "grpc_connect" in c1 and "ws_cache" in c1
        else NA
    )

    keep = by_name.get("keepup")
    keep_rows = keep["rows"] if keep else []
    for mode in ("grpc_connect", "grpc_single", "ws_cache"):
        for r in keep_rows:
            if r["mode"] != mode:
                continue
            tag = "default" if "default" in r["policy"] else r["policy"].split()[0]
            if r["policy"].startswith("window 0"):
                tag = "w0"
            out[f"keep.{mode}.{tag}.share"] = _num(r["server_core_share"] * 100, 1)
            out[f"keep.{mode}.{tag}.delivery"] = _num(r["delivery"] * 100, 1)
        for tag in ("default", "off", "w0"):
            out.setdefault(f"keep.{mode}.{tag}.share", NA)
            out.setdefault(f"keep.{mode}.{tag}.delivery", NA)
    out["keep.tps"] = _num(keep["params"]["tokens_per_second"] if keep else None, 0)
    for mode in ("grpc_single", "ws_cache"):
        out[f"keep.{mode}.per_message_us"] = _per_message_us(keep_rows, mode)

    steer = _rows(by_name.get("steer"))
    for key in ("ws_cache", "grpc_connect"):
        r = steer.get(key, {})
        out[f"steer.{key}.ack"] = _spread(
            r.get("ack_p50_ms"), r.get("ack_p10_ms"), r.get("ack_p90_ms"), 2, "ms"
        )
        out[f"steer.{key}.first"] = _spread(
            r.get("successor_first_token_p50_ms"),
            r.get("successor_first_token_p10_ms"),
            r.get("successor_first_token_p90_ms"),
            1,
            "ms",
        )
    out["aiperf"] = _aiperf(aiperf, head)
    out["peers"] = peers_section(peers)
    return out


def _template() -> str:
    # resolve(): an editable install links this module from the source tree, where the
    # template is; an installed wheel carries it as package data beside the module.
    return Path(__file__).resolve().with_name("results_template.md").read_text(encoding="utf-8")


def render_document(
    report: Report,
    aiperf: JSONObject | None = None,
    template: str | None = None,
    peers: JSONObject | None = None,
) -> str:
    """The whole document; raises ValueError naming any placeholder the run cannot fill."""
    values = figures(report, aiperf, peers)
    text = _template() if template is None else template
    unknown = sorted({m.group(1) for m in PLACEHOLDER.finditer(text)} - values.keys())
    if unknown:
        raise ValueError(f"unknown placeholders in the results template: {', '.join(unknown)}")
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def write_document(report: Report, out_dir: Path, doc: Path | None = None) -> dict[str, Path]:
    """results.md in ``out_dir``; with ``doc``, also that file and its plots beside it.

    The plots go to a folder named after the document (docs/results.md: docs/results/), where
    the document's image links point. ``out_dir/aiperf.json`` and ``out_dir/peers.json`` are
    included when present.
    """
    aiperf_path = out_dir / "aiperf.json"
    aiperf = json.loads(aiperf_path.read_text(encoding="utf-8")) if aiperf_path.is_file() else None
    # A run of the network sweep alone (make compare-network) is its own document.
    template = NETWORK_TEMPLATE if network_only(report) else None
    peers_path = out_dir / "peers.json"
    peers = json.loads(peers_path.read_text(encoding="utf-8")) if peers_path.is_file() else None
    text = render_document(report, aiperf, template, peers)
    paths = {"document": out_dir / "results.md"}
    # In the output folder the plots sit beside the document, not in results/.
    local = text.replace("](results/", "](").replace("](results-network/", "](")
    paths["document"].write_text(local, encoding="utf-8")
    if doc is not None:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(text, encoding="utf-8")
        paths["doc"] = doc
        plots = doc.parent / doc.stem
        plots.mkdir(exist_ok=True)
        for png in sorted(out_dir.glob("*.png")):
            shutil.copyfile(png, plots / png.name)
    return paths


def _engine_texts(engine: str) -> dict[str, str]:
    """Where the engine ran, in the words of the Setup, Figures and Caveats sections."""
    if engine == "process":
        return {
            "run.engine": (
                "The simulated engine runs in its own process (`bench/sim_backend.py`), "
                "behind the token-level completions API as vLLM and llama.cpp serve it; the "
                "server under test reaches it through its production `completions` route "
                "(rendering to token ids, one streamed request per response, the sampled ids "
                "parsed back into items), over loopback HTTP."
            ),
            "run.engine_cpu": (
                "the engine's pacing and prefix hashing are in the engine's own process and "
                "not in this figure (*engine CPU ms/turn* is that process's CPU per turn); the "
                "server's cost of the completions route (the prompt's ids sent each turn, the "
                "sampled ids parsed) is in it, the same in every mode"
            ),
            "run.keepup_rest": "reading the engine's stream (its pacing is in its own process)",
            "run.engine_caveat": (
                "The engine is simulated, in its own process on the same two cores; its CPU is "
                "reported apart from the server's. `--engine inproc` runs it inside the server "
                "instead, as reports before this one did."
            ),
        }
    if engine == "inproc":
        return {
            "run.engine": "The simulated engine runs inside the server process (`--engine "
            "inproc`).",
            "run.engine_cpu": (
                "it includes the simulated engine's pacing and prefix hashing, the same in "
                "every mode"
            ),
            "run.keepup_rest": "the engine's pacing (it runs inside the server)",
            "run.engine_caveat": (
                "The engine is simulated inside the server process; its pacing and prefix "
                "hashing use the same event loop and CPU as the API, identically in every mode."
            ),
        }
    return {
        "run.engine": f"The engine is `{engine}` (see the command).",
        "run.engine_cpu": "the engine's own cost is wherever that engine runs",
        "run.keepup_rest": "the engine's work where it runs",
        "run.engine_caveat": f"The engine is `{engine}` (see the command).",
    }
