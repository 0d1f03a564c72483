"""The client worker process: commands from the orchestrator's pipe, plain-dict results back."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import Connection

from ..cpu import process_cpu_clock
from ..jsontypes import JSONObject
from ..wire import WireCounter
from ..workload import user_item
from .agent import AgentRun, run_agent
from .commands import (
    AgentsCommand,
    AgentsResult,
    Command,
    KeepupCommand,
    KeepupResponse,
    KeepupResult,
    SteerCommand,
    SteerResult,
    SteerRound,
)
from .exchange import BenchError
from .grpc_conn import GrpcConnectConn
from .kit import ClientKit
from .modes import MODES
from .ws_conn import WsConn
from .ws_lanes import WsLanes

__all__ = ["worker_main"]


def _base_body(cmd: AgentsCommand) -> JSONObject:
    base: JSONObject = {
        "model": cmd.get("model", "sim-model"),
        "store": bool(cmd.get("store_all", False)),
    }
    if cmd.get("instructions"):
        base["instructions"] = cmd["instructions"]
    if cmd.get("tools"):
        base["tools"] = cmd["tools"]
    if cmd.get("tool_choice"):
        base["tool_choice"] = cmd["tool_choice"]
    return base


async def _cmd_agents(cmd: AgentsCommand, progress: Callable[[], None]) -> AgentsResult:
    """Run ``agents`` rollouts concurrently (one rollout when ``agents`` is 1)."""
    mode = MODES[cmd["mode"]]
    server = cmd["server"]
    agents = int(cmd.get("agents", 1))
    wire = WireCounter(server.host, server.ports) if cmd.get("bytes", True) else None
    outputs = cmd["tool_outputs"]
    first_input = cmd.get("first_input") or []
    base = _base_body(cmd)

    async def one(kit: ClientKit, index: int, shared: GrpcConnectConn | WsLanes | None) -> AgentRun:
        conn = shared.lane(f"agent-{index}") if shared is not None else await kit.conn()
        run: AgentRun | None = None
        try:
            first = list(first_input) or [
                user_item(f"Session {cmd['nonce']}-{index}.\n\n{cmd['user_text']}")
            ]
            run = await run_agent(
                conn,
                mode,
                base=base,
                first_input=first,
                output_for=lambda turn: outputs[turn % len(outputs)],
                tool_ms=float(cmd.get("tool_ms", 0.0)),
                max_tool_turns=cmd.get("max_tool_turns"),
                setup_turns=int(cmd.get("setup_turns", 0)),
                repeat=int(cmd.get("repeat", 0)),
                agent=int(cmd.get("agent_base", 0)) + index,
                wire=wire,
                server_cpu=server_cpu if agents == 1 else None,
                progress=progress,
            )
            return run
        finally:
            await conn.aclose(abort=run is None or run.waiting)

    server_cpu = process_cpu_clock(server.pid) if server.pid else None
    cpu0 = os.times()
    t0 = time.perf_counter()
    if agents == 1:
        # Each rollout opens its own clients, so it pays its own connection setup.
        async with ClientKit(mode, server, wire) as kit:
            runs = [await one(kit, 0, None)]
    else:
        async with ClientKit(mode, server, None) as kit:
            shared = await kit.shared() if cmd.get("lanes") else None
            try:
                runs = list(await asyncio.gather(*(one(kit, i, shared) for i in range(agents))))
            finally:
                if shared is not None:
                    await shared.aclose()
    t1 = time.perf_counter()
    cpu1 = os.times()
    return {
        "turns": [asdict(r) for run in runs for r in run.turns],
        "rollouts": [
            {
                "agent": r.turns[0].agent if r.turns else 0,
                "t_start": r.t_start,
                "t_end": r.t_end,
                "e2e_s": r.t_end - r.t_start,
                "turns": len(r.turns),
                "status": r.final_status,
            }
            for r in runs
        ],
        "t_start": t0,
        "t_end": t1,
        "client_cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
    }


async def _cmd_keepup(cmd: KeepupCommand, progress: Callable[[], None]) -> KeepupResult:
    """Long text answers on one stream: how fast do deltas arrive, against the engine rate."""
    # The sweep compares the server's delta policies; the client's own window would override
    # them on Connect, so it keeps the server's.
    mode = dataclasses.replace(MODES[cmd["mode"]], delta_window_ms=0)
    server = cmd["server"]
    results: list[KeepupResponse] = []
    t0 = time.perf_counter()
    async with ClientKit(mode, server, None) as kit:
        conn = await kit.conn()
        try:
            previous: str | None = None
            for index in range(int(cmd["responses"])):
                body: JSONObject = {
                    "model": "sim-model",
                    "store": False,
                    "input": [user_item(f"Continue ({index}).")],
                }
                if previous is not None:
                    body["previous_response_id"] = previous
                ex = await conn.create(body)
                if ex.final.get("type") != "response.completed":
                    raise BenchError(f"keep-up response ended with {ex.final}")
                response = ex.final["response"]
                previous = response["id"]
                usage = response.get("usage") or {}
                results.append(
                    {
                        "output_tokens": int(usage.get("output_tokens", 0)),
                        "t_send": ex.t_send,
                        "t_first_delta": ex.t_first_delta,
                        "t_last_delta": ex.t_last_delta,
                        "t_end": ex.t_end,
                        "deltas": ex.deltas,
                        "events": ex.events,
                        "engine_ms": float((response.get("stats") or {}).get("engine_ms", 0.0)),
                    }
                )
                progress()
        finally:
            await conn.aclose()
    return {"responses": results, "t_start": t0, "t_end": time.perf_counter()}


async def _cmd_steer(cmd: SteerCommand, progress: Callable[[], None]) -> SteerResult:
    """Steered responses on one stream: steer sent -> acknowledgement, and -> the automatic
    successor's first token."""
    mode = MODES[cmd["mode"]]
    rounds: list[SteerRound] = []
    t0 = time.perf_counter()
    async with ClientKit(mode, cmd["server"], None) as kit:
        conn = await kit.conn()
        if not isinstance(conn, WsConn | GrpcConnectConn):
            raise BenchError(f"mode {mode.key} has no stream to steer on")
        try:
            for index in range(int(cmd["rounds"])):
                body: JSONObject = {
                    "model": "sim-model",
                    "store": False,
                    "input": [user_item(f"Write a long story ({index}).")],
                }
                rounds.append(await conn.steer_round(body))
                progress()
        finally:
            await conn.aclose()
    return {"rounds": rounds, "t_start": t0, "t_end": time.perf_counter()}


async def _run(
    cmd: Command, progress: Callable[[], None]
) -> AgentsResult | KeepupResult | SteerResult:
    if cmd["cmd"] == "agents":
        return await _cmd_agents(cmd, progress)
    if cmd["cmd"] == "steer":
        return await _cmd_steer(cmd, progress)
    return await _cmd_keepup(cmd, progress)


def worker_main(conn: Connection) -> None:
    """A client process: run commands from the pipe until it sends None.

    Messages back are ``("progress", 1)`` per turn, then ``("result", dict)`` or
    ``("error", text)``.
    """
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        while True:
            try:
                cmd = conn.recv()
            except EOFError:
                return
            if cmd is None:
                return
            try:
                result = loop.run_until_complete(_run(cmd, lambda: conn.send(("progress", 1))))
            except Exception:
                conn.send(("error", traceback.format_exc()))
            else:
                conn.send(("result", result))
    finally:
        loop.close()
