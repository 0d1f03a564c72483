"""Agents through Envoy over replicas, with replicas lost mid-run (``make failover``).

``failover``: A agents x T turns over 3 replicas; when a third of the turns are done one
replica is killed (SIGKILL), at two thirds another is drained (SIGTERM). Checked afterwards:
every rollout completed all its turns, each turn continues the one before it (no turn lost,
none doubled), and PostgreSQL holds exactly one ledger row per completed response and no
other completed row, and every conversation's stored chain.

``throughput``: the same agents, no failures, over 1, 2 and 3 replicas: turns per second.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
from bidi_responses.bench.jsontypes import JSONObject
from bidi_responses.client import AsyncResponsesClient, Conversation, Response

from .replicas import Cluster

TOOL: JSONObject = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command.",
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
    },
}

# The sim answers with tool calls for as many turns as an agent runs.
SERVE_ARGS = ("--sim-tool-rounds", "1000", "--log-level", "WARNING")


@dataclass(slots=True)
class RunResult:
    """What the agents saw."""

    agents: int
    turns: int
    seconds: float
    rollouts: list[list[str]] = field(default_factory=list)
    retries: int = 0
    reconnects: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def turns_done(self) -> int:
        """Acknowledged turns."""
        return sum(len(r) for r in self.rollouts)

    @property
    def turns_per_second(self) -> float:
        """Throughput over the whole run."""
        return self.turns_done / self.seconds if self.seconds else 0.0


def _tool_output(agent: int, turn: int, chars: int) -> str:
    line = f"agent {agent} turn {turn}: build log line with some source text {{}}\n"
    return (line * (chars // len(line) + 1))[:chars]


async def _agent(
    client: AsyncResponsesClient,
    n: int,
    turns: int,
    output_chars: int,
    done: list[int],
    on_turn: Callable[[], None],
) -> tuple[list[Response], Conversation]:
    conversation = Conversation(client, key_prefix=f"agent{n}_{time.time_ns()}", deadline_s=120)
    responses: list[Response] = []
    response = await conversation.create(model="sim-model", input=f"agent {n}", tools=[TOOL])
    responses.append(response)
    done[0] += 1
    on_turn()
    while len(responses) < turns:
        response = await conversation.create(
            model="sim-model",
            previous_response_id=response.id,
            tools=[TOOL],
            input=[response.call_output(_tool_output(n, len(responses), output_chars))],
        )
        responses.append(response)
        done[0] += 1
        on_turn()
    await conversation.close()
    return responses, conversation


async def run_agents(
    target: str,
    agents: int,
    turns: int,
    *,
    output_chars: int = 2000,
    on_turn: Callable[[int], None] | None = None,
) -> RunResult:
    """``agents`` chained rollouts of ``turns`` responses each through ``target``."""
    done = [0]

    def tick() -> None:
        if on_turn is not None:
            on_turn(done[0])

    started = time.perf_counter()
    async with AsyncResponsesClient(target) as client:
        outcomes = await asyncio.gather(
            *(_agent(client, n, turns, output_chars, done, tick) for n in range(agents)),
            return_exceptions=True,
        )
    result = RunResult(agents, turns, time.perf_counter() - started)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            result.failures.append(repr(outcome))
            continue
        responses, conversation = outcome
        result.rollouts.append([r.id for r in responses])
        result.retries += conversation.retries
        result.reconnects += conversation.reconnects
        # Each turn must continue the one before it: nothing skipped, nothing repeated.
        for before, after in itertools.pairwise(responses):
            if after.previous_response_id != before.id:
                result.failures.append(f"{after.id} does not continue {before.id}")
    return result


@dataclass(slots=True)
class LedgerCheck:
    """PostgreSQL's view of a run."""

    completed_rows: int
    other_rows: dict[str, int]
    missing: list[str]
    doubled: list[str]
    unexpected: list[str]
    broken_chains: list[str]

    @property
    def ok(self) -> bool:
        """One completed ledger row per acknowledged turn, nothing else completed, every
        conversation stored whole."""
        return not (self.missing or self.doubled or self.unexpected or self.broken_chains)


async def check_ledger(url: str, rollouts: Sequence[Sequence[str]]) -> LedgerCheck:
    """Compare the acknowledged turns with the ledger and the stored chains."""
    acked = [rid for rollout in rollouts for rid in rollout]
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT response_id, status FROM usage_ledger")
        links = dict(await conn.fetch("SELECT id, previous_response_id FROM responses"))
    finally:
        await conn.close()
    completed: dict[str, int] = {}
    other: dict[str, int] = {}
    for rid, status in rows:
        if status == "completed":
            completed[rid] = completed.get(rid, 0) + 1
        else:
            other[status] = other.get(status, 0) + 1
    acked_set = set(acked)
    broken: list[str] = []
    for rollout in rollouts:
        current: str | None = rollout[-1] if rollout else None
        walked: list[str] = []
        while current is not None and current in links and len(walked) <= len(rollout):
            walked.append(current)
            current = links[current]
        if walked[::-1] != list(rollout):
            broken.append(rollout[0] if rollout else "?")
    return LedgerCheck(
        completed_rows=sum(completed.values()),
        other_rows=other,
        missing=[rid for rid in acked if rid not in completed],
        doubled=[rid for rid, count in completed.items() if count > 1],
        unexpected=[rid for rid in completed if rid not in acked_set],
        broken_chains=broken,
    )


async def failover(
    agents: int,
    turns: int,
    *,
    replicas: int = 3,
    kill_at: float = 1 / 3,
    drain_at: float = 2 / 3,
    serve_args: Sequence[str] = SERVE_ARGS,
    output_chars: int = 2000,
) -> JSONObject:
    """The failover run; returns its report (``ok`` says whether every check held)."""
    total = agents * turns
    cluster = Cluster(replicas, serve_args=serve_args, http=False, fast_postgres=False)
    loop = asyncio.get_running_loop()
    events: list[str] = []
    actions: list[Awaitable[int]] = []

    def on_turn(done: int) -> None:
        if done == int(total * kill_at):
            events.append(f"SIGKILL replica 0 after {done} turns")
            cluster.kill(0)
        elif done == int(total * drain_at):
            events.append(f"SIGTERM replica 1 after {done} turns")
            cluster.terminate(1)
            actions.append(loop.run_in_executor(None, cluster.wait, 1, 60.0))

    await loop.run_in_executor(None, cluster.start)
    try:
        result = await run_agents(
            cluster.grpc_target, agents, turns, output_chars=output_chars, on_turn=on_turn
        )
        drained_exit = await asyncio.gather(*actions)
        check = await check_ledger(cluster.store_url, result.rollouts)
        survivors: dict[int, dict[str, int]] = {}
        for replica in cluster.replicas:
            if replica.alive:
                async with AsyncResponsesClient(f"127.0.0.1:{replica.grpc_port}") as direct:
                    survivors[replica.index] = (await direct.stats())["failover"]
    finally:
        await loop.run_in_executor(None, cluster.stop)
    complete = len(result.rollouts) == agents and all(len(r) == turns for r in result.rollouts)
    return {
        "ok": complete and not result.failures and check.ok and drained_exit == [0],
        "agents": agents,
        "turns": turns,
        "replicas": replicas,
        "events": events,
        "drained_replica_exit": drained_exit,
        "rollouts_complete": sum(len(r) == turns for r in result.rollouts),
        "turns_acknowledged": result.turns_done,
        "retried_turns": result.retries,
        "streams_opened": result.reconnects,
        "client_failures": result.failures[:10],
        "ledger_completed_rows": check.completed_rows,
        "ledger_other_rows": check.other_rows,
        "missing": check.missing[:10],
        "doubled": check.doubled[:10],
        "unexpected": check.unexpected[:10],
        "broken_chains": check.broken_chains[:10],
        "seconds": round(result.seconds, 2),
        # Counters of the replicas still up: replayed turns, states taken over.
        "survivor_failover_counters": survivors,
    }


def _cpu_seconds(pids: Sequence[int]) -> float:
    """User+system CPU of these processes and their children so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                times = process.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


def _component_pids(cluster: Cluster) -> dict[str, list[int]]:
    pids = {
        "replicas": [r.process.pid for r in cluster.replicas if r.process is not None],
        "envoy": [cluster.envoy.pid] if cluster.envoy and cluster.envoy.pid else [],
        "postgres": [cluster.postgres.pid] if cluster.postgres and cluster.postgres.pid else [],
    }
    return pids


async def throughput(
    counts: Sequence[int],
    agents: int,
    turns: int,
    *,
    serve_args: Sequence[str] = SERVE_ARGS,
    output_chars: int = 2000,
) -> list[JSONObject]:
    """Turns per second through Envoy with each replica count (no failures)."""
    loop = asyncio.get_running_loop()
    rows = []
    for n in counts:
        cluster = Cluster(n, serve_args=serve_args, http=False)
        await loop.run_in_executor(None, cluster.start)
        try:
            pids = _component_pids(cluster)
            before = {name: _cpu_seconds(p) for name, p in pids.items()}
            client_before = time.process_time()
            result = await run_agents(cluster.grpc_target, agents, turns, output_chars=output_chars)
            cpu = {name: _cpu_seconds(p) - before[name] for name, p in pids.items()}
            cpu["client"] = time.process_time() - client_before
        finally:
            await loop.run_in_executor(None, cluster.stop)
        done = max(result.turns_done, 1)
        rows.append(
            {
                "replicas": n,
                "turns": result.turns_done,
                "seconds": round(result.seconds, 2),
                "turns_per_second": round(result.turns_per_second, 1),
                "failures": len(result.failures),
                # CPU per acknowledged turn, by component (ms): what the projection uses.
                "cpu_ms_per_turn": {k: round(v * 1000 / done, 3) for k, v in cpu.items()},
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``make failover`` and ``make replicas-throughput``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["failover", "throughput"])
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--replicas", default="3", help="failover: N; throughput: 1,2,3")
    parser.add_argument("--output-chars", type=int, default=2000, help="tool output size")
    parser.add_argument("--repeats", type=int, default=1, help="throughput: runs per count")
    args, serve_args = parser.parse_known_args(argv)
    serve = [*SERVE_ARGS, *serve_args]
    if args.mode == "failover":
        report = asyncio.run(
            failover(
                args.agents,
                args.turns,
                replicas=int(args.replicas),
                serve_args=serve,
                output_chars=args.output_chars,
            )
        )
        print(json.dumps(report, indent=2))
        return 0 if report["ok"] else 1
    counts = [int(c) for c in args.replicas.split(",")]
    for _ in range(args.repeats):
        rows = asyncio.run(
            throughput(
                counts, args.agents, args.turns, serve_args=serve, output_chars=args.output_chars
            )
        )
        for row in rows:
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
