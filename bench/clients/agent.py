"""The agent loop every mode shares, and the record of each turn it measures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..jsontypes import JSONObject
from ..wire import WireCounter
from .exchange import BenchError, Conn, wire_snapshot
from .modes import ModeInfo

__all__ = ["AgentRun", "TurnRecord", "run_agent"]


@dataclass(slots=True)
class TurnRecord:
    """One turn as the client saw it, with the server's counters for that turn."""

    mode: str
    repeat: int
    agent: int
    turn: int
    setup: bool
    history_tokens: int
    input_items: int
    turn_ms: float
    ttft_ms: float | None
    engine_ms: float
    overhead_ms: float
    api_pre_ms: float
    api_post_ms: float
    tokens_rendered: int
    tokens_reused: int
    items_validated: int
    prefill_tokens: int
    bytes_sent: int | None
    bytes_received: int | None
    events: int
    deltas: int
    #: Transport messages that carried the turn's events (None: not visible to the client).
    messages: int | None = None
    #: Server CPU time for this turn (None when several agents share the server).
    server_cpu_ms: float | None = None
    #: This client process's CPU time for this turn.
    client_cpu_ms: float | None = None
    #: Time per pre-inference pipeline stage (``response.stats.stage_ms``) for this turn.
    stage_ms: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class AgentRun:
    """What ``run_agent`` returns: the turns and the rollout's wall-clock span."""

    turns: list[TurnRecord]
    t_start: float
    t_end: float
    final_status: str
    #: True when the loop stopped while an append-mode response still waits for outputs.
    waiting: bool = False


_CUMULATIVE = ("engine_ms", "tokens_rendered", "items_validated", "prefill_tokens", "api_post_ms")


async def run_agent(
    conn: Conn,
    mode: ModeInfo,
    *,
    base: JSONObject,
    first_input: list[JSONObject],
    output_for: Callable[[int], str],
    tool_ms: float = 0.0,
    max_tool_turns: int | None = None,
    setup_turns: int = 0,
    repeat: int = 0,
    agent: int = 0,
    wire: WireCounter | None = None,
    server_cpu: Callable[[], float] | None = None,
    progress: Callable[[], None] | None = None,
) -> AgentRun:
    """Run one agent until the model answers (or ``max_tool_turns`` outputs were sent).

    ``base`` is the constant part of every create (model, instructions, tools, store); the
    first ``setup_turns`` turns are marked as setup (the history sweep's prefill).
    ``server_cpu`` reads the server's CPU time (seconds); with one agent on the server, a
    turn's share is the CPU used from the end of the previous turn to the end of this one.
    """
    history: list[JSONObject] = []
    new_input = list(first_input)
    previous: JSONObject | None = None
    last_stats: dict[str, float] = {}
    last_stages: dict[str, float] = {}
    records: list[TurnRecord] = []
    tool_turn = 0
    cpu_mark = server_cpu() if server_cpu is not None else 0.0
    own_mark = time.process_time()
    t_start = time.perf_counter()
    while True:
        before = wire_snapshot(wire)
        if mode.history == "append" and previous is not None:
            ex = await conn.append(previous["id"], new_input)
        else:
            body = dict(base)
            if mode.history == "full":
                body["input"] = history + new_input
            else:
                body["input"] = new_input
                if previous is not None:
                    body["previous_response_id"] = previous["id"]
            if mode.history == "append":
                body["append_mode"] = True
            if mode.history == "store":
                body["store"] = True
            ex = await conn.create(body)
        event = ex.final
        kind = event.get("type")
        if kind == "error":
            raise BenchError(f"{mode.key} turn {len(records)}: error event {event.get('error')}")
        response = event["response"]
        if response.get("status") == "failed":
            raise BenchError(f"{mode.key} turn {len(records)}: failed: {response.get('error')}")
        stats = response.get("stats") or {}
        if mode.history == "append":
            # One long response: its counters are cumulative, a turn is the difference.
            turn_stats = {k: float(stats.get(k, 0)) - last_stats.get(k, 0.0) for k in _CUMULATIVE}
            last_stats = {k: float(stats.get(k, 0)) for k in _CUMULATIVE}
            stages = {k: float(v) for k, v in (stats.get("stage_ms") or {}).items()}
            stage_ms = {k: v - last_stages.get(k, 0.0) for k, v in stages.items()}
            last_stages = stages
            history_tokens = int(last_stats["tokens_rendered"])
            pre_ms = float(stats.get("api_pre_ms", 0.0)) if previous is None else 0.0
        else:
            turn_stats = {k: float(stats.get(k, 0)) for k in _CUMULATIVE}
            stage_ms = {k: float(v) for k, v in (stats.get("stage_ms") or {}).items()}
            usage = response.get("usage") or {}
            history_tokens = int(usage.get("input_tokens", 0))
            pre_ms = float(stats.get("api_pre_ms", 0.0))
        sent = received = None
        if wire is not None and before is not None and ex.wire_after is not None:
            sent, received = WireCounter.delta(before, ex.wire_after)
        cpu_ms: float | None = None
        if server_cpu is not None:
            now = server_cpu()
            cpu_ms, cpu_mark = (now - cpu_mark) * 1000, now
        own = time.process_time()
        client_ms, own_mark = (own - own_mark) * 1000, own
        turn_ms = (ex.t_end - ex.t_send) * 1000
        engine_ms = turn_stats["engine_ms"]
        records.append(
            TurnRecord(
                mode=mode.key,
                repeat=repeat,
                agent=agent,
                turn=len(records),
                setup=len(records) < setup_turns,
                history_tokens=history_tokens,
                input_items=len(new_input),
                turn_ms=turn_ms,
                ttft_ms=(ex.t_first_delta - ex.t_send) * 1000 if ex.t_first_delta else None,
                engine_ms=engine_ms,
                overhead_ms=turn_ms - engine_ms,
                api_pre_ms=pre_ms,
                api_post_ms=turn_stats["api_post_ms"],
                tokens_rendered=int(turn_stats["tokens_rendered"]),
                tokens_reused=int(stats.get("tokens_reused", 0)),
                items_validated=int(turn_stats["items_validated"]),
                prefill_tokens=int(turn_stats["prefill_tokens"]),
                bytes_sent=sent,
                bytes_received=received,
                events=ex.events,
                deltas=ex.deltas,
                messages=ex.messages,
                server_cpu_ms=cpu_ms,
                client_cpu_ms=client_ms,
                stage_ms=stage_ms,
            )
        )
        if progress is not None:
            progress()
        if kind == "response.done":
            calls = list(event.get("pending_calls") or [])
        elif mode.history == "append":
            calls = []  # the terminal event of the one long response: its output has every call
        else:
            calls = [i for i in response.get("output", ()) if i.get("type") == "function_call"]
        if mode.history == "full":
            # The client keeps the conversation and sends all of it next time, echoing the
            # model's items as it received them (as Codex does over HTTP).
            history.extend(new_input)
            history.extend(response.get("output", ()))
        previous = response
        if not calls or (max_tool_turns is not None and tool_turn >= max_tool_turns):
            break
        if tool_ms > 0:
            await asyncio.sleep(tool_ms / 1000)
        new_input = [
            {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": output_for(tool_turn),
            }
            for call in calls
        ]
        tool_turn += 1
    return AgentRun(
        records,
        t_start,
        time.perf_counter(),
        str(previous.get("status", "")),
        waiting=kind == "response.done",
    )
