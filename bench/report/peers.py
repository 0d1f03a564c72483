"""The peers section of docs/results.md, from ``make peers``'s ``peers.json`` (see bench/peers.py).

Measured context: the figures come from that run, not from ``compare``'s; the section says so,
names the command and states the issue's CPU target against SMG from the same run.
"""

from __future__ import annotations

from .records import JSONObject, JSONValue

__all__ = ["peers_section"]

_MODES = ("http_full", "http_previous", "websocket", "connect")
_MODE_LABELS = {
    "http_full": "HTTP full history",
    "http_previous": "HTTP `previous_response_id`",
    "websocket": "WebSocket mode",
    "connect": "gRPC Connect",
}
_SERVERS = {"bidi": "this project", "smg": "SMG"}


def _cell(spread: JSONValue) -> str:
    if not isinstance(spread, dict):
        return "n/a"
    return f"{spread['median']:.2f} [{spread['min']:.2f}-{spread['max']:.2f}]"


def _median(cell: JSONObject, figure: str, which: str) -> float | None:
    per = cell.get(figure)
    if isinstance(per, dict):
        spread = per.get(which)
        if isinstance(spread, dict) and isinstance(spread.get("median"), int | float):
            return float(spread["median"])
    return None


def peers_section(peers: JSONObject | None) -> str:
    """The table of every cell, the skipped cells with their reason, and the CPU target."""
    if not peers:
        return (
            "*(the peers benchmark was not run with this report: `make peers` runs it and "
            "writes `bench-out/peers.json`, which the next `make compare` or `make report` "
            "picks up)*"
        )
    cells = peers.get("cells")
    if not isinstance(cells, dict):
        return "*peers.json holds no cells*"
    workload = peers.get("workload")
    tokens = workload.get("tokens", {}) if isinstance(workload, dict) else {}
    lines = [
        f"Command: `{peers.get('command', 'make peers')}`"
        + (f"; {peers['smg_version']}" if peers.get("smg_version") else "")
        + ". One agent loop of "
        f"{peers.get('turns')} turns (a user message, then one tool output of "
        f"~{tokens.get('tool_output', 'n/a')} tokens a turn, 8 tools, "
        f"~{tokens.get('instructions', 'n/a')} tokens of instructions), each cell "
        f"{peers.get('repeats')} loops after a warm-up, the cells taking turns; every server "
        "behind the same instant fake model in its own process (`bench/peers_model.py`), "
        "which reports its own time. *Overhead* is the turn's time at the client minus the "
        "model's; *server CPU* is the server process's CPU clock across the turn. Median "
        "[min-max] over the loops; a *tool turn* is each loop's median over turns 2 to "
        f"{peers.get('turns')}.",
        "",
        "| server | mode | overhead ms, tool turn | first | last | server CPU ms, tool turn "
        "| first | last |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for server, label in _SERVERS.items():
        for mode in _MODES:
            cell = cells.get(f"{server}.{mode}")
            if not isinstance(cell, dict):
                continue
            o, c = cell["overhead_ms"], cell["cpu_ms"]
            assert isinstance(o, dict) and isinstance(c, dict)
            lines.append(
                f"| {label} | {_MODE_LABELS[mode]} | {_cell(o['tool_turn'])} | "
                f"{_cell(o['first'])} | {_cell(o['last'])} | {_cell(c['tool_turn'])} | "
                f"{_cell(c['first'])} | {_cell(c['last'])} |"
            )
    skipped = peers.get("skipped")
    if isinstance(skipped, dict):
        for name, reason in skipped.items():
            lines += ["", f"{_SERVERS.get(name, name)}: not measured ({reason})."]
    lines += ["", *_targets(cells)]
    return "\n".join(lines)


def _targets(cells: dict[str, JSONValue]) -> list[str]:
    """The issue's targets that this run measures, each met or missed."""
    out: list[str] = []
    smg = cells.get("smg.http_previous")
    smg_cpu = _median(smg, "cpu_ms", "tool_turn") if isinstance(smg, dict) else None
    for mode in ("websocket", "connect"):
        cell = cells.get(f"bidi.{mode}")
        cpu = _median(cell, "cpu_ms", "tool_turn") if isinstance(cell, dict) else None
        if cpu is None or smg_cpu is None:
            continue
        verdict = "met" if cpu <= smg_cpu else f"missed ({cpu / smg_cpu:.1f}x)"
        out.append(
            f"- Target, a stateful turn at most SMG's pass-through turn in server CPU: "
            f"{_MODE_LABELS[mode]} {cpu:.2f} ms against SMG's `previous_response_id` "
            f"{smg_cpu:.2f} ms a tool turn: **{verdict}**."
        )
    prev, ws = cells.get("bidi.http_previous"), cells.get("bidi.websocket")
    if isinstance(prev, dict) and isinstance(ws, dict):
        p, w = _median(prev, "cpu_ms", "tool_turn"), _median(ws, "cpu_ms", "tool_turn")
        first, last = _median(prev, "cpu_ms", "first"), _median(prev, "cpu_ms", "last")
        if p is not None and w is not None:
            verdict = "met" if p <= 1.5 * w else "missed"
            out.append(
                f"- Target, an HTTP `previous_response_id` turn within 1.5x of a WebSocket "
                f"turn (server CPU): {p:.2f} against {w:.2f} ms ({p / w:.2f}x): **{verdict}**."
            )
        second = _second_turn(prev)
        if last is not None and second is not None and first is not None:
            verdict = "met" if last <= 1.3 * second else "missed"
            out.append(
                f"- Target, its 20th turn within 1.3x of its first: {last:.2f} ms against "
                f"{second:.2f} ms for the first tool turn ({last / second:.2f}x; the very first "
                f"turn, a user message with no parent, {first:.2f} ms): **{verdict}**."
            )
    return out


def _second_turn(cell: JSONObject) -> float | None:
    per_turn = cell.get("per_turn_cpu_ms")
    if isinstance(per_turn, list) and len(per_turn) > 1 and isinstance(per_turn[1], int | float):
        return float(per_turn[1])
    return None
