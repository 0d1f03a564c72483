"""Soak: N agents x T turns over each transport against one server, all agents at once.

``python -m bidi_responses.bench.soak`` (``make soak``) starts ``bidi-responses serve`` as a
subprocess and runs, one transport after another on that same server, N concurrent agents of
T tool-calling turns each: gRPC Connect (one stream per agent on a shared channel), WebSocket
mode (one connection per agent) and HTTP+SSE with ``previous_response_id`` (store). It reports
per transport the responses lost (a turn that never got its terminal event), duplicated (a
response id seen twice, or ledger rows beyond the turns), failed (error events or failed
responses), the turn time p50/p99 (first turns and later turns apart, since all streams open
at once), and the server's RSS before the load (after a small warm-up on every transport), at
its peak, and after the streams close.

The simulated engine keeps a bounded prefix (KV) cache in the server's process: it models GPU
memory of an inference server, but its bookkeeping (about ``PREFIX_BLOCK_BYTES`` per block)
is on this heap and counts in the RSS. The soak states its size in the header
(``--sim-prefix-blocks``, the engine's default unless given; 0 turns it off).

Defaults fit a 2-core machine (50 x 10); ``--full`` runs 200 x 25.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
import psutil
from bidi_responses.client.aio import AsyncResponsesClient
from bidi_responses.server.core.storage.sqlite_schema import read_ledger
from bidi_responses.server.engine_config import SimConfig
from bidi_responses.server.engines.sim import PREFIX_BLOCK_BYTES

from .clients import ClientKit, Conn, GrpcConnectConn, resolve_modes
from .jsontypes import JSONObject
from .run import ServerProcess, ServerSettings
from .soak_results import AgentResult, TransportResult, format_table

TRANSPORTS = {"grpc": "grpc_connect", "websocket": "ws_cache", "http": "http_store"}
TOOL: JSONObject = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command and return its output.",
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
    },
}
STREAMS_PER_CHANNEL = 50
TOOL_OUTPUT = "Process exited with code 0\nOutput:\n" + "src/module.py:12: ok\n" * 20


@dataclass(slots=True)
class SoakSettings(ServerSettings):
    """The soak's server: the benchmark's settings plus the sim engine's prefix-cache size."""

    prefix_cache_max_blocks: int = SimConfig().prefix_cache_max_blocks

    def toml(self) -> str:
        """The server's config file, with the cache size in the sim engine's table (the last)."""
        text = ServerSettings.toml(self)
        tables = [line for line in text.splitlines() if line.startswith("[")]
        assert tables[-1] == '[models."sim-model".sim]', text
        return text + f"prefix_cache_max_blocks = {int(self.prefix_cache_max_blocks)}\n"


def prefix_cache_note(blocks: int) -> str:
    """The header line saying how much of the server's heap the sim engine may keep."""
    if blocks == 0:
        return "sim engine prefix cache: off (--sim-prefix-blocks 0)"
    mib = blocks * PREFIX_BLOCK_BYTES / 2**20
    return (
        f"sim engine prefix cache: up to {blocks:,} blocks, ~{mib:.1f} MiB of the server's heap"
        " (models KV memory of the inference server)"
    )


async def _agent(conn: Conn, turns: int, index: int, timeout_s: float, store: bool) -> AgentResult:
    result = AgentResult()
    # Streams chain through their cache; HTTP chains through the store.
    body: JSONObject = {"model": "sim-model", "tools": [TOOL], "store": store}
    new_input: list[JSONObject] = [
        {"type": "message", "role": "user", "content": f"agent {index}: fix the failing test"}
    ]
    previous: str | None = None
    for _ in range(turns):
        request = {**body, "input": new_input}
        if previous is not None:
            request["previous_response_id"] = previous
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                exchange = await conn.create(request)
        except TimeoutError:
            result.lost += 1
            return result
        except Exception as error:  # a refused or broken turn (BenchError, socket errors)
            result.failed += 1
            result.errors.append(f"{type(error).__name__}: {error}"[:300])
            return result
        event = exchange.final
        response = event.get("response") or {}
        if event.get("type") == "error" or response.get("status") == "failed":
            result.failed += 1
            return result
        turn_ms = (time.perf_counter() - started) * 1000
        stats = response.get("stats") or {}
        server_ms = sum(
            float(stats.get(k, 0.0)) for k in ("api_pre_ms", "engine_ms", "api_post_ms")
        )
        result.turn_ms.append(turn_ms)
        result.pre_ms.append(float(stats.get("api_pre_ms", 0.0)))
        result.outside_ms.append(max(turn_ms - server_ms, 0.0))
        result.ids.append(response["id"])
        previous = response["id"]
        calls = [item for item in response.get("output", ()) if item["type"] == "function_call"]
        new_input = [
            {"type": "function_call_output", "call_id": c["call_id"], "output": TOOL_OUTPUT}
            for c in calls
        ] or [{"type": "message", "role": "user", "content": "go on"}]
    return result


#: When the first late stream opens, and how often the next ones do, while the load runs.
LATE_OPEN_START_S = 0.5
LATE_OPEN_EVERY_S = 0.25


async def _late_opens(
    open_conn: Callable[[], Awaitable[Conn]], stop: asyncio.Event, timeout_s: float
) -> list[float]:
    """Open a new stream every ``LATE_OPEN_EVERY_S`` while the load runs, each on its own
    connection, and time it from the open to the first event of a create (ms)."""
    times: list[float] = []
    body: JSONObject = {"model": "sim-model", "input": "a new agent", "store": False}
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LATE_OPEN_START_S):
            await stop.wait()  # the load's start, on a schedule (not a synchronization)
    while not stop.is_set():
        started = time.perf_counter()
        conn = None
        try:
            async with asyncio.timeout(timeout_s):
                conn = await open_conn()
                exchange = await conn.create(body)
            if exchange.t_first_event is not None:
                times.append((exchange.t_first_event - started) * 1000)
        finally:
            if conn is not None:
                await conn.aclose()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LATE_OPEN_EVERY_S):
                await stop.wait()
    return times


async def _rss_sampler(pid: int, peak: list[int], stop: asyncio.Event) -> None:
    process = psutil.Process(pid)
    while not stop.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.1):
                await stop.wait()


async def _stats(base: str) -> JSONObject:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(f"{base}/v1/stats") as reply:
        data: JSONObject = orjson.loads(await reply.read())
        return data


async def _settled_rss(server: ServerProcess, base: str, deadline_s: float = 30.0) -> int:
    """RSS once no stream is open and the post-inference queue is empty."""
    assert server.proc is not None
    limit = time.monotonic() + deadline_s
    while time.monotonic() < limit:
        stats = await _stats(base)
        if int(stats.get("streams_open", 0)) == 0 and int(stats.get("post_queue_depth", 0)) == 0:
            break
        await asyncio.sleep(0.1)  # polling the server's own counters, with a deadline
    # The server hands freed memory back a moment after it goes idle: wait for the RSS to
    # stop falling (sampled every 0.1 s; settled when flat for 1.5 s), within the deadline.
    process = psutil.Process(server.proc.pid)
    samples: list[int] = [process.memory_info().rss]
    while time.monotonic() < limit + 10:
        await asyncio.sleep(0.1)  # sampling the RSS, not waiting for an event
        samples.append(process.memory_info().rss)
        window = samples[-16:]
        if len(window) == 16 and max(window) - min(window) <= window[-1] // 100:
            break
    return samples[-1]


async def soak_transport(
    server: ServerProcess, transport: str, agents: int, turns: int, timeout_s: float
) -> TransportResult:
    """Run ``agents`` concurrent agents of ``turns`` turns on one transport."""
    address = server.address
    assert address is not None and server.proc is not None
    base = f"http://{address.host}:{address.http_port}"
    mode = resolve_modes([TRANSPORTS[transport]])[0]
    rss_before = await _settled_rss(server, base)
    rows_before = len(read_ledger(server.dir / "data" / "responses.db"))
    peak = [rss_before]
    stop = asyncio.Event()
    sampler = asyncio.ensure_future(_rss_sampler(server.proc.pid, peak, stop))
    started = time.perf_counter()
    async with contextlib.AsyncExitStack() as stack:
        if transport == "grpc":
            # One HTTP/2 connection per STREAMS_PER_CHANNEL agents: the server caps open
            # streams per connection (``max_streams_per_connection``, 100), and channels
            # share connections unless each has its own subchannel pool.
            target = f"{address.host}:{address.grpc_port}"
            clients = [
                await stack.enter_async_context(
                    AsyncResponsesClient(
                        target,
                        channel=grpc.aio.insecure_channel(
                            target, options=[("grpc.use_local_subchannel_pool", 1)]
                        ),
                    )
                )
                for _ in range(-(-agents // STREAMS_PER_CHANNEL))
            ]
            conns: list[Conn] = [
                await GrpcConnectConn(clients[i // STREAMS_PER_CHANNEL], None).open()
                for i in range(agents)
            ]

            async def open_late() -> Conn:
                # Its own client and channel: a new HTTP/2 connection, as a new agent's.
                client = await stack.enter_async_context(AsyncResponsesClient(target))
                return await GrpcConnectConn(client, None).open()

        else:
            kit = await stack.enter_async_context(ClientKit(mode, address, None))
            conns = [await kit.conn() for _ in range(agents)]
            open_late = kit.conn
        loaded = asyncio.Event()
        prober = asyncio.ensure_future(_late_opens(open_late, loaded, timeout_s))
        try:
            results = await asyncio.gather(
                *(
                    _agent(conn, turns, i, timeout_s, transport == "http")
                    for i, conn in enumerate(conns)
                )
            )
        finally:
            loaded.set()
            late_open_ms = await prober
            await asyncio.gather(*(c.aclose() for c in conns), return_exceptions=True)
    seconds = time.perf_counter() - started
    rss_after = await _settled_rss(server, base)
    stop.set()
    await sampler
    rows = len(read_ledger(server.dir / "data" / "responses.db")) - rows_before
    return TransportResult(
        transport,
        agents,
        turns,
        seconds,
        list(results),
        rows,
        rss_before,
        peak[0],
        rss_after,
        late_open_ms,
    )


def run_soak(
    agents: int,
    turns: int,
    transports: Sequence[str],
    workdir: Path,
    timeout_s: float = 120.0,
    progress: bool = False,
    sim_prefix_blocks: int | None = None,
    rounds: int = 1,
) -> list[JSONObject]:
    """Soak every transport in turn on one server, ``rounds`` times; one summary per burst."""
    settings = SoakSettings(tool_rounds=turns + 1, function_call_tokens=40)
    if sim_prefix_blocks is not None:
        settings.prefix_cache_max_blocks = sim_prefix_blocks
    with ServerProcess(settings, workdir, "soak") as server:

        async def run_all() -> list[JSONObject]:
            # A small warm-up on every transport first, so the RSS baseline includes what a
            # server allocates once (imports, caches, thread pools), not just an idle start.
            for transport in transports:
                await soak_transport(server, transport, min(agents, 8), min(turns, 3), timeout_s)
            summaries = []
            for round_index in range(rounds):
                for transport in transports:
                    result = await soak_transport(server, transport, agents, turns, timeout_s)
                    summaries.append(result.summary())
                    summaries[-1]["round"] = round_index + 1
                    if progress:
                        print(format_table(summaries[-1:]).splitlines()[-1], flush=True)
            return summaries

        summaries = asyncio.run(run_all())
        alive = server.proc is not None and server.proc.poll() is None
    for summary in summaries:
        summary["server_alive"] = alive
        summary["sim_prefix_blocks"] = settings.prefix_cache_max_blocks
    return summaries


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: print the table; exit 1 if anything was lost, duplicated or failed."""
    parser = argparse.ArgumentParser(description="N agents x T turns per transport, one server")
    parser.add_argument("--agents", type=int, default=50, help="concurrent agents (50)")
    parser.add_argument("--turns", type=int, default=10, help="turns per agent (10)")
    parser.add_argument("--full", action="store_true", help="200 agents x 25 turns")
    parser.add_argument(
        "--transports", default="grpc,websocket,http", help="comma-separated (all three)"
    )
    parser.add_argument(
        "--sim-prefix-blocks",
        type=int,
        default=None,
        help="size of the sim engine's prefix cache in blocks (its default; 0 = off)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every transport this many times on the same server (1); later rounds show "
        "whether memory is reused or keeps growing",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--workdir", default=None, help="keep the server's data and log here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.sim_prefix_blocks is not None and args.sim_prefix_blocks < 0:
        parser.error(f"--sim-prefix-blocks must be >= 0, got {args.sim_prefix_blocks}")
    agents, turns = (200, 25) if args.full else (args.agents, args.turns)
    with (
        contextlib.nullcontext(args.workdir)
        if args.workdir
        else tempfile.TemporaryDirectory(prefix="soak-")
    ) as workdir:
        if not args.json:
            print(f"soak: {agents} agents x {turns} turns per transport, one server")
            blocks = args.sim_prefix_blocks
            print(
                prefix_cache_note(
                    SoakSettings().prefix_cache_max_blocks if blocks is None else blocks
                )
            )
            print(format_table([]), flush=True)
        summaries = run_soak(
            agents,
            turns,
            args.transports.split(","),
            Path(workdir),
            progress=not args.json,
            sim_prefix_blocks=args.sim_prefix_blocks,
            rounds=args.rounds,
        )
    if args.json:
        print(orjson.dumps(summaries, option=orjson.OPT_INDENT_2).decode())
    for summary in summaries:
        for error in summary["errors"]:
            print(f"{summary['transport']}: {error}")
    bad = any(
        s["lost"] or s["duplicated"] or s["failed"] or s["responses"] != s["expected"]
        for s in summaries
    )
    return 1 if bad or not all(s["server_alive"] for s in summaries) else 0


if __name__ == "__main__":
    raise SystemExit(main())
