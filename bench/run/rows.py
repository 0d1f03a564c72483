"""Row assembly: the workers' raw results of one measured run turned into the cell's rows."""

from __future__ import annotations

from ..clients import AgentsResult, KeepupResult, SteerResult
from ..jsontypes import JSONObject

__all__ = ["keepup_run", "measured_run", "steer_run"]


def measured_run(
    tags: JSONObject,
    results: list[AgentsResult],
    server_cpu_s: float,
    engine_cpu_s: float = 0.0,
) -> tuple[JSONObject, list[JSONObject]]:
    """One run's row and its turns (each tagged), from the results of its parallel jobs;
    ``engine_cpu_s`` is the engine process's CPU over the run (0: the engine ran in the
    server, whose CPU then includes it)."""
    turns = [dict(t, **tags) for r in results for t in r["turns"]]
    measured = [t for t in turns if not t["setup"]]
    rollouts = [ro for r in results for ro in r["rollouts"]]
    t_start = min(r["t_start"] for r in results)
    t_end = max(r["t_end"] for r in results)
    run = {
        **tags,
        "server_cpu_s": server_cpu_s,
        "engine_cpu_s": engine_cpu_s,
        "client_cpu_s": sum(r["client_cpu_s"] for r in results),
        "wall_s": t_end - t_start,
        "responses": len(turns),
        "measured_turns": len(measured),
        "e2e_s": [ro["e2e_s"] for ro in rollouts],
        "statuses": sorted({ro["status"] for ro in rollouts}),
    }
    return run, turns


def keepup_run(
    mode: str,
    policy: str,
    window: float | None,
    tps: float,
    result: KeepupResult,
    server_cpu_s: float,
) -> JSONObject:
    """The keep-up row of one mode and delta policy: delivered rate, messages, server CPU."""
    rates = []
    deltas = []
    tokens = 0
    streaming_s = 0.0
    for r in result["responses"]:
        first, last = r["t_first_delta"], r["t_last_delta"]
        n = r["output_tokens"]
        tokens += n
        deltas.append(r["deltas"])
        if first is not None and last is not None and last > first:
            # n tokens arrive over (n - 1) token intervals from the first to the last delta.
            rates.append((n - 1) / (last - first))
            streaming_s += last - first
    wall = result["t_end"] - result["t_start"]
    return {
        "mode": mode,
        "policy": policy,
        "window_ms": window,
        "engine_tps": tps,
        "delivered_tps": sorted(rates)[len(rates) // 2] if rates else 0.0,
        "delivery": (sorted(rates)[len(rates) // 2] / tps) if rates else 0.0,
        "rates": rates,
        "tokens": tokens,
        "deltas_per_response": deltas,
        "tokens_per_message": tokens / max(sum(deltas), 1),
        "server_cpu_s": server_cpu_s,
        "wall_s": wall,
        "streaming_s": streaming_s,
        # Share of one core over the command (connection, TTFTs and streaming).
        "server_core_share": server_cpu_s / wall if wall > 0 else 0.0,
    }


def steer_run(mode: str, repeat: int, result: SteerResult) -> JSONObject:
    """The steering rounds of one mode and repeat, as milliseconds from the steer's send."""
    rounds = []
    for r in result["rounds"]:
        first = r["t_successor_first_token"]
        rounds.append(
            {
                "accepted": r["accepted"],
                "target_status": r["target_status"],
                "target_reason": r["target_reason"],
                "successor_status": r["successor_status"],
                "ack_ms": (r["t_ack"] - r["t_steer"]) * 1000,
                "successor_first_token_ms": None
                if first is None
                else (first - r["t_steer"]) * 1000,
            }
        )
    return {"mode": mode, "repeat": repeat, "rounds": rounds}
